package batchlane_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
)

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
	logs := &logtest.Buffer{}
	var passes atomic.Int64 // a failing pass reads the clock once, at its start (Once)
	bat := batchlane.New(batchlane.Config{Pool: b.pool, Tick: leaderTick, Metrics: b.metrics,
		Now:     func() time.Time { passes.Add(1); return b.clock.Now() },
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
		Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
		Enqueue: func(context.Context, string, jobs.Priority) error { return nil }})
	runBatcher(t, bat)

	require.Eventually(t, func() bool { return passes.Load() >= 5 }, wait, 10*time.Millisecond)
	require.Equal(t, 1, lines(logs, "WARN", "batch lane pass"), "a run of failed passes logs once")

	_, err = b.pool.Exec(ctx, `ALTER TABLE provider_batches_gone RENAME TO provider_batches`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return lines(logs, "INFO", "batch lane pass succeeds again") == 1 }, wait, 10*time.Millisecond)
	require.Equal(t, 1, lines(logs, "WARN", "batch lane pass"))
}

// TestBatcher_ANewLeadLogsItsFailedPassesAgain: a leader whose passes failed loses the lead
// (its lock session ended) to another process, whose passes succeed; leading again later, its
// passes fail anew. That run of failures is logged: it was not, the process's streak carried
// over from its earlier lead, so the log of the worker leading a stalled batch lane (the alert
// names the line) said nothing of it.
func TestBatcher_ANewLeadLogsItsFailedPassesAgain(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	ctx := t.Context()
	breakTable := func(gone bool) {
		t.Helper()
		q := `ALTER TABLE provider_batches RENAME TO provider_batches_gone`
		if !gone {
			q = `ALTER TABLE provider_batches_gone RENAME TO provider_batches`
		}
		_, err := b.pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	breakTable(true)
	logs := &logtest.Buffer{}
	var passes atomic.Int64 // a failing pass reads the clock once, at its start (Once)
	bat := batchlane.New(batchlane.Config{Pool: b.pool, Tick: leaderTick, Metrics: b.metrics,
		Now:     func() time.Time { passes.Add(1); return b.clock.Now() },
		Logger:  slog.New(slog.NewTextHandler(logs, nil)),
		Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
		Enqueue: func(context.Context, string, jobs.Priority) error { return nil }})
	runBatcher(t, bat)
	require.Eventually(t, func() bool { return lines(logs, "WARN", "batch lane pass failed") == 1 }, wait, 10*time.Millisecond)

	// Another process takes the lead: the test's session, once the batcher's lock session is
	// ended (a failover, as the batcher sees it).
	other, err := pgx.Connect(ctx, b.pool.Config().ConnString())
	require.NoError(t, err)
	defer other.Close(context.Background())
	require.Eventually(t, func() bool {
		var mine bool
		if err := other.QueryRow(ctx, `SELECT pg_try_advisory_lock(x'6c6c6d7162746368'::bigint)`).Scan(&mine); err != nil || mine {
			return mine
		}
		_, _ = other.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
WHERE locktype = 'advisory' AND pid <> pg_backend_pid()
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`)
		return false
	}, wait, 10*time.Millisecond, "the test's session never took the lead")
	// With the lead elsewhere the table comes back (the other's passes succeed: the run of
	// failures ends), and goes again later.
	breakTable(false)
	breakTable(true)
	_, err = other.Exec(ctx, `SELECT pg_advisory_unlock(x'6c6c6d7162746368'::bigint)`)
	require.NoError(t, err)

	// The batcher leads again (its session holds the lock) and makes failing passes.
	require.Eventually(t, func() bool {
		var n int
		err := other.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return err == nil && n == 1
	}, wait, 10*time.Millisecond, "the batcher did not lead again")
	from := passes.Load()
	require.Eventually(t, func() bool { return passes.Load() >= from+3 }, wait, 10*time.Millisecond)
	require.Equal(t, 2, lines(logs, "WARN", "batch lane pass failed"), "the new lead's failed passes are logged, once")
}

// lines returns the log lines in logs of level (INFO, WARN) whose message starts with msg.
func lines(logs *logtest.Buffer, level, msg string) int {
	return logs.Count(`level=` + level + ` msg="` + msg)
}
