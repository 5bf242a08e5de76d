package executor_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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

// A provider call answers while Postgres is unreachable, and stays so past the window in which
// the delivery tries to store the answer. The answer is dropped and the job is called again later
// (it is paid twice): an error line of its own says so, naming the job, the attempt, the
// credential and the answer's usage, so that an operator can count those calls.
func TestExecutor_LogsAPaidAnswerDroppedAfterTheRecordWindow(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pg, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	pool, err := pgxpool.New(ctx, viaProxy)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := jobs.NewStore(pool, nil)
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pg.Cut() // Postgres goes away while the call is out, and does not come back in time
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-dropped"})
	require.NoError(t, err)
	var logs logtest.Buffer
	ex := executor.New(executor.Config{Store: store, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		RecordRetryWindow: 200 * time.Millisecond,
		Upstreams:         map[string]executor.Upstream{"primary": {Name: "primary", Kind: string(llm.KindAnthropic), Provider: p}}})
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "primary", MaxAttempts: 3, Timeout: time.Minute,
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)})
	require.NoError(t, err)

	// When the delivery's call answers and Postgres stays unreachable past the record window
	done := make(chan error, 1)
	go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()
	select {
	case err := <-done:
		require.Error(t, err, "the answer could not be stored")
	case <-time.After(60 * time.Second):
		t.Fatal("the delivery did not return within 60s")
	}

	// Then one error line says a paid answer was dropped, naming the job, attempt, credential and usage
	var line string
	for l := range strings.Lines(logs.String()) {
		if strings.Contains(l, "paid answer dropped") {
			require.Empty(t, line, "one line only: %s", logs.String())
			line = l
		}
	}
	require.NotEmpty(t, line, "no line for the dropped answer: %s", logs.String())
	require.Contains(t, line, "level=ERROR")
	require.Contains(t, line, "job_id="+job.ID)
	require.Contains(t, line, "attempt=1")
	require.Contains(t, line, "credential=primary")
	require.Contains(t, line, "input_tokens")
}
