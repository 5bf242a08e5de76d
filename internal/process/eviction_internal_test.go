package process

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestWarnEviction_SilentRedisDelaysTheStartByItsBoundOnly: a Redis that accepts connections and
// never answers delays a starting process by evictionCheckTimeout, not by go-redis's own read
// timeouts (which ignore the context: 5 s), and the check is logged at debug only.
func TestWarnEviction_SilentRedisDelaysTheStartByItsBoundOnly(t *testing.T) {
	t.Parallel()
	silent, _ := redistest.Stalled(t)
	logs := &logtest.Buffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	done := make(chan time.Duration, 1)
	go func() {
		t0 := time.Now()
		warnEviction(context.Background(), &config.Config{RedisURL: "redis://" + silent}, logger)
		done <- time.Since(t0)
	}()
	select {
	case took := <-done:
		t.Logf("took %v", took)
	case <-time.After(evictionCheckTimeout + time.Second):
		t.Fatalf("the check did not end within its bound of %v and a second", evictionCheckTimeout)
	}
	require.Equal(t, 1, logs.Count("could not read redis's maxmemory-policy"), logs.String())
	require.Zero(t, logs.Count("redis may evict"), logs.String())
}
