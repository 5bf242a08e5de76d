package executor_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/pgtest"
)

// A provider call answers and the connection its outcome goes out on falls silent. The batch
// waited its bound (30 s), as long as record keeps trying (30 s): the outcome of a call made and
// paid for was never tried again, the delivery failed, and the job's next delivery called the
// provider again once the lease ran out. The batch's bound is well under record's window now:
// the outcome is stored on a new connection, and the job succeeds on its one call.
func TestExecutor_SilentConnectionDoesNotLoseAnOutcome(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	pool, err := pgxpool.New(ctx, viaProxy+"&pool_max_conns=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Before the pool's close, which waits for its connections.
	t.Cleanup(proxy.Cut)
	// A batch's bound well under record's window (30 s), as the default (10 s) is, but shorter:
	// the test waits it out once.
	store := jobs.NewStoreOpts(pool, jobs.StoreOpts{BatchTimeout: 2 * time.Second})
	var calls atomic.Int32
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-silent"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p},
	}})
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", MaxAttempts: 3, Timeout: time.Minute,
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)})
	require.NoError(t, err)

	// When the connection the call's outcome goes out on falls silent
	silenced := proxy.SilenceStatement("UPDATE jobs SET status = $2, result = coalesce($3, result)")
	done := make(chan error, 1)
	go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()
	require.True(t, silenced(ctx), "the outcome was not sent")

	// Then the delivery stores it all the same: the job succeeded, on its one call
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the delivery still waits on a silent connection")
	}
	got, err := store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, 1, got.Attempts)
	require.Equal(t, int32(1), calls.Load())
}
