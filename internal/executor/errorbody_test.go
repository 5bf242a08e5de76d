package executor_test

import (
	"io"
	"log/slog"
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
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// A 200 whose body is the provider's error object (Anthropic's overloaded_error here, as a
// gateway in front of the provider may pass it on) is not an answer: the job is retried as a 529
// would be, instead of succeeding with the error for its result.
func TestExecutor_ErrorObjectIn200IsRetried(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-errbody"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store, Logger: slog.New(slog.DiscardHandler),
		Policy: retrypolicy.New(&retrypolicy.Config{Float64: func() float64 { return 0.5 }}),
		Upstreams: map[string]executor.Upstream{"errbody": {Name: "errbody", Kind: string(llm.KindAnthropic), Provider: p,
			Gate: lim.Gate("sk-errbody", "errbody"), Circuit: brk.Circuit("sk-errbody", "errbody")}}})

	job, err := process(t, b, ex, "errbody", 5, time.Hour)
	var deferred *dispatch.DeferError
	require.ErrorAs(t, err, &deferred)
	require.Equal(t, jobs.StatusRetrying, job.Status, "retried, not succeeded")
	require.Nil(t, job.Result)
	require.Equal(t, string(retrypolicy.ClassRetryable), job.LastError.Class)
	require.Equal(t, 529, job.LastError.Status)
	require.Equal(t, "overloaded_error", job.LastError.Type)
}
