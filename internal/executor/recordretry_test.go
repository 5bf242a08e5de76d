package executor_test

import (
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

// A provider call answers while Postgres is unreachable. The delivery keeps trying to store the
// answer until Postgres is back, instead of handing the job back to asynq (whose next delivery
// would wait out the attempt's lease and call the provider again): the job succeeds on one call.
func TestExecutor_RecordsAnAnswerOncePostgresIsBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pgtest.URL(t)
	pg, viaProxy := pgtest.NewProxy(t, dbURL)
	pool, err := pgxpool.New(ctx, viaProxy)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := jobs.NewStore(pool, nil)
	var calls atomic.Int32
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		pg.Cut() // Postgres goes away while the call is out
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-record"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p},
	}})
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", MaxAttempts: 3, Timeout: time.Minute,
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)})
	require.NoError(t, err)

	// When the delivery's call answers while Postgres is unreachable
	done := make(chan error, 1)
	go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()

	// Then it keeps trying to store the answer (Postgres is refused to it more than once)
	require.Eventually(t, func() bool { return pg.Refused() >= 2 || len(done) > 0 }, 30*time.Second, time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the delivery returned while Postgres was down: %v", err)
	default:
	}

	// And once Postgres is back, stores it: the job succeeded, on its one call
	pg.Restore()
	require.NoError(t, <-done)
	got, err := store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, 1, got.Attempts)
	require.Equal(t, int32(1), calls.Load())
}
