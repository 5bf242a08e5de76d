package batchlane_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// lines returns the log lines of level (INFO, WARN) whose message starts with msg.
func (s *syncBuffer) lines(level, msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.buf.String(), `level=`+level+` msg="`+msg)
}

// runBatcher runs b until the test ends.
func runBatcher(t *testing.T, b *batchlane.Batcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(wait):
			t.Error("Run did not return after its context ended")
		}
	})
}

// TestBatcher_LogsARunOfFailedPassesOnce: a leader whose passes fail (here a table gone; in
// production Postgres refusing, or a statement timing out) logs the first failure of the run and
// the first success after it, not a line a pass (one a second, in every outage).
func TestBatcher_LogsARunOfFailedPassesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := t.Context()
	_, err := b.pool.Exec(ctx, `ALTER TABLE provider_batches RENAME TO provider_batches_gone`)
	require.NoError(t, err)
	logs := &syncBuffer{}
	var passes atomic.Int64 // a failing pass reads the clock once, at its start (Once)
	bat := batchlane.New(batchlane.Config{Pool: b.pool, Tick: leaderTick, Metrics: b.metrics,
		Now:     func() time.Time { passes.Add(1); return b.clock.Now() },
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
		Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
		Enqueue: func(context.Context, string, jobs.Priority) error { return nil }})
	runBatcher(t, bat)

	require.Eventually(t, func() bool { return passes.Load() >= 5 }, wait, 10*time.Millisecond)
	require.Equal(t, 1, logs.lines("WARN", "batch lane pass"), "a run of failed passes logs once")

	_, err = b.pool.Exec(ctx, `ALTER TABLE provider_batches_gone RENAME TO provider_batches`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return logs.lines("INFO", "batch lane pass succeeds again") == 1 }, wait, 10*time.Millisecond)
	require.Equal(t, 1, logs.lines("WARN", "batch lane pass"))
}
