package batchlane_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
)

// While Postgres is unreachable every worker's try to lead the batch lane fails, every tick:
// the first failure of the run is logged, not each (one line per second per worker, for the
// whole outage), as the maintenance passes log theirs.
func TestBatcher_PostgresOutageLogsOnce(t *testing.T) {
	t.Parallel()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	pool, err := pgxpool.New(t.Context(), viaProxy)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	proxy.Cut()

	var logs logtest.Buffer
	b := batchlane.New(batchlane.Config{Pool: pool, Tick: 10 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for proxy.Refused() < 3 { // three tries at least, each refused
		require.True(t, time.Now().Before(deadline), "the batcher did not try to lead three times in 30 s")
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())
}
