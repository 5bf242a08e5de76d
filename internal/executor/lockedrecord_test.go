package executor_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
)

// A call answers while another session holds its job's row locked (a cancel whose client fell
// silent, an operator's open transaction). record tries the outcome again for 30 s; each try
// went out in one of the store's batches and waited for the lock its 2 s, and every transition
// of the process (other jobs' reads, starts and outcomes) queued behind it, about two thirds of
// the time for 30 s. A try after one that waited for the lock goes out beside the batches now.
//
// The store's lock bound (and its batches') and record's window are long, so that a read queued
// behind a try that waits for the lock in a batch is not answered within the test's deadline,
// however slow the machine; the first try still runs out of its wait, on the pool sessions' own
// lock_timeout (shorter ones win), which is 2 s until that try is seen to give up, and none after.
func TestExecutor_LockedRowsOutcomeDoesNotHoldOtherJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	var sessionLockTimeout atomic.Value
	sessionLockTimeout.Store("2s")
	cfg, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	cfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		_, err := c.Exec(ctx, `SELECT set_config('lock_timeout', $1, false)`, sessionLockTimeout.Load())
		return true, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	store := jobs.NewStoreOpts(pool, jobs.StoreOpts{LockTimeout: time.Hour, BatchTimeout: time.Hour})
	params := jobs.CreateParams{Tenant: "default", Credential: "default", MaxAttempts: 3, Timeout: time.Minute,
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)}
	job, _, err := store.Create(ctx, params)
	require.NoError(t, err)
	other, _, err := store.Create(ctx, params)
	require.NoError(t, err)

	// A session that takes the job's row lock while the call is out, and keeps it
	locker := make(chan pgx.Tx, 1)
	var calls atomic.Int32
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			tx, err := direct.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusTeapot)
				return
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			locker <- tx
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-locked"})
	require.NoError(t, err)
	var logs logtest.Buffer
	ex := executor.New(executor.Config{Store: store, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		RecordRetryWindow: time.Hour,
		Upstreams:         map[string]executor.Upstream{"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p}}})

	// When the call's outcome waited for the locked row past its bound, and is tried again
	done := make(chan error, 1)
	go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()
	require.Eventually(t, func() bool {
		return logs.Count("trying again") > 0 || len(done) > 0
	}, 30*time.Second, time.Millisecond, "the outcome's first try waited for the lock")
	require.Empty(t, done, "the delivery returned while the row was locked")
	sessionLockTimeout.Store("0")
	// (a wait past the first bound is a try's that began after it was lifted)
	require.Eventually(t, func() bool {
		var n int
		err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
				AND now() - query_start > interval '3 s'`).Scan(&n)
		return err == nil && n > 0
	}, 30*time.Second, 10*time.Millisecond, "a later try waits for the lock, without the first's bound")

	// Then another job's read is answered meanwhile
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	got, err := store.Get(rctx, other.ID)
	rcancel()
	require.NoError(t, err, "a read of another job, while the outcome waits for its row")
	require.Equal(t, other.ID, got.ID)

	// And once the lock is let go, the outcome is stored: the job succeeded on its one call
	require.NoError(t, (<-locker).Rollback(ctx))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the delivery did not end")
	}
	got, err = store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, int32(1), calls.Load())
}
