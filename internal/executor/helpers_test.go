package executor_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// helloRequest is a small Anthropic request body.
var helloRequest = json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)

// sharedAdmission returns a limiter and a breaker on rdb, under the test's own key prefix.
func sharedAdmission(t testing.TB, rdb *redis.Client) (*limiter.Limiter, *breaker.Breaker) {
	t.Helper()
	prefix := redistest.Prefix(t)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: prefix})
	require.NoError(t, err)
	brk, err := breaker.New(rdb, &breaker.Config{Prefix: prefix})
	require.NoError(t, err)
	return lim, brk
}

// simProvider returns an Anthropic provider sending with key to a simulator configured by cfg,
// which runs until the test ends.
func simProvider(t testing.TB, cfg llmsim.Config, key string) llm.Provider {
	t.Helper()
	return simProviderOf(t, llm.KindAnthropic, cfg, key)
}

// simProviderOf is simProvider for a provider of kind.
func simProviderOf(t testing.TB, kind llm.Kind, cfg llmsim.Config, key string) llm.Provider {
	t.Helper()
	sim := httptest.NewServer(llmsim.New(cfg))
	t.Cleanup(sim.Close)
	p, err := llm.New(llm.Config{Kind: kind, BaseURL: sim.URL, APIKey: key})
	require.NoError(t, err)
	return p
}

// process commits a job of helloRequest on credential, runs one delivery of it with ex and
// returns the job as stored after it, and the delivery's error.
func process(t *testing.T, b *jobstest.Bundle, ex *executor.Executor, credential string, maxAttempts int,
	timeout time.Duration) (*jobs.Job, error) {
	t.Helper()
	ctx := t.Context()
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: credential,
		Request: helloRequest, MaxAttempts: maxAttempts, Timeout: timeout})
	require.NoError(t, err)
	perr := ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	return got, perr
}

// failedStreamAttempt commits a streaming job on a provider of kind served by llmsim with
// faults, runs one delivery of it, which the faults must fail for a retry (a DeferError), and
// returns the job's one attempt row and the job as stored after it.
func failedStreamAttempt(t *testing.T, kind llm.Kind, faults llmsim.Faults) (jobs.AttemptRow, *jobs.Job) {
	t.Helper()
	ctx := t.Context()
	b := jobstest.New(t)
	sim := httptest.NewServer(llmsim.New(llmsim.Config{Faults: faults}))
	t.Cleanup(sim.Close)
	p, err := llm.New(llm.Config{Kind: kind, BaseURL: sim.URL, APIKey: "sk-stream"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store,
		Policy:    retrypolicy.New(&retrypolicy.Config{Float64: func() float64 { return 0 }}),
		Upstreams: map[string]executor.Upstream{"sim": {Name: "sim", Kind: string(kind), Provider: p}}})
	model := map[llm.Kind]string{llm.KindOpenAI: "gpt-test", llm.KindAnthropic: "claude-test"}[kind]
	body := json.RawMessage(`{"model":"` + model + `","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "sim", Request: body,
		MaxAttempts: 2, Timeout: time.Minute})
	require.NoError(t, err)
	var de *dispatch.DeferError
	require.True(t, errors.As(ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &de), "the failed stream is retried")
	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	stored, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	return attempts[0], stored
}

// alertWebhook returns the URL of an alert webhook that answers at once and passes each body
// posted to it on to the returned channel (which holds up to n), until the test ends.
func alertWebhook(t *testing.T, n int) (string, chan string) {
	t.Helper()
	posted := make(chan string, n)
	hook := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		posted <- string(body)
	}))
	t.Cleanup(hook.Close)
	return hook.URL, posted
}

// spendRetryBudget spends gate's retry budget: its last AllowRetry was refused (one refusal
// counted, by an unnamed retry).
func spendRetryBudget(t *testing.T, gate *limiter.Gate) {
	t.Helper()
	for range 1000 {
		ok, err := gate.AllowRetry(t.Context(), "")
		require.NoError(t, err)
		if !ok {
			return
		}
	}
	t.Fatal("the retry budget was never spent")
}
