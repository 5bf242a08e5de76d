package executor_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// An answer that began, then stalled, held the attempt until its attempt_timeout (5m by
// default). With the credential's stall timeout set, the attempt ends then as a timeout: its row
// has class timeout, the 200 and the time to the body's first byte, the job's last error names
// the stall, and the job is retried.
func TestExecutor_StalledAnswerIsATimeoutAndRetried(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id":"msg_`)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // then nothing, until the client gives up
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-stall"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store,
		Policy: retrypolicy.New(&retrypolicy.Config{Float64: func() float64 { return 0 }}),
		Upstreams: map[string]executor.Upstream{"gw": {Name: "gw", Kind: string(llm.KindAnthropic), Provider: p,
			AttemptTimeout: 20 * time.Second, StallTimeout: 100 * time.Millisecond}}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "gw", MaxAttempts: 2, Timeout: time.Hour,
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)})
	require.NoError(t, err)

	start := time.Now()
	var de *dispatch.DeferError
	require.True(t, errors.As(ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &de), "the stalled attempt is retried")
	require.Less(t, time.Since(start), 10*time.Second, "the stall timeout, not the attempt's, ended it")

	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	a := attempts[0]
	require.Equal(t, string(retrypolicy.ClassTimeout), a.Class)
	require.NotNil(t, a.Error)
	require.Contains(t, *a.Error, "no new answer byte for 100ms after the body began")
	require.NotNil(t, a.StatusCode, "the provider answered")
	require.Equal(t, http.StatusOK, *a.StatusCode)
	require.NotNil(t, a.TTFBMS, "its body began")

	stored, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusRetrying, stored.Status)
	require.NotNil(t, stored.LastError)
	require.Equal(t, string(retrypolicy.ClassTimeout), stored.LastError.Class)
	require.Contains(t, stored.LastError.Message, "no new answer byte for 100ms after the body began")
}
