package process

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestWarnEviction_SilentRedisDelaysTheStartByItsBoundOnly: a Redis that accepts connections and
// never answers delays a starting process by the check's bound, not by the client's read timeout
// (which ignores the context): a client with none at all is let go at the bound too. The check
// is logged at info only.
func TestWarnEviction_SilentRedisDelaysTheStartByItsBoundOnly(t *testing.T) {
	t.Parallel()
	silent, _ := redistest.Stalled(t)
	logs := &logtest.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	// No read timeout: only the check's own bound can end its read.
	rdb := redis.NewClient(&redis.Options{Addr: silent, ReadTimeout: -1, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		checkEviction(context.Background(), rdb, 50*time.Millisecond, logger)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the check did not end at its bound: its read waits for a Redis that never answers")
	}
	require.Equal(t, 1, logs.Count("could not read redis's maxmemory-policy"), logs.String())
	require.Zero(t, logs.Count("redis may evict"), logs.String())
}
