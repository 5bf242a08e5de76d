package deltastream

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/logtest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestWriter_LogsItsFailedWritesOnce: with Redis unreachable, every write of a streaming
// attempt's pieces fails (each at once: the connection is refused); the attempt logs its first
// failure only, not a line per piece (a line per token of every stream, while Redis is away).
func TestWriter_LogsItsFailedWritesOnce(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	logs := &logtest.Buffer{}
	b := New(Config{Redis: rdb, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	w := b.Writer("job-1", 2, 1)
	idle := func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return !w.queued && !w.writing
	}
	for range 5 {
		w.Add(Delta{Type: "text", Text: "token "})
		// Its write round ends (failed) before the next piece: one write per piece.
		require.Eventually(t, idle, 30*time.Second, time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.Close(ctx)
	require.NoError(t, ctx.Err())
	require.Equal(t, 1, logs.Count(`msg="write stream deltas`), "the attempt's failed writes log once")
}
