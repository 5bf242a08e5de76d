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
func TestExecutor_LockedRowsOutcomeDoesNotHoldOtherJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	store := jobs.NewStore(pool, nil)
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
		Upstreams: map[string]executor.Upstream{"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p}}})

	// When the call's outcome waited for the locked row past its bound, and is tried again
	done := make(chan error, 1)
	go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()
	require.Eventually(t, func() bool {
		return logs.Count("trying again") > 0 || len(done) > 0
	}, 20*time.Second, time.Millisecond, "the outcome's first try waited for the lock")
	require.Empty(t, done, "the delivery returned while the row was locked")
	require.Eventually(t, func() bool {
		var n int
		err := direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, 20*time.Second, time.Millisecond, "a later try waits for the lock")

	// Then another job's read is answered meanwhile, well within the lock's 2 s
	rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
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
