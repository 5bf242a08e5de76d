package executor_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
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

// always429 is a provider answering every call 429 with the Retry-After header given (none when
// retryAfter is nil).
func always429(t *testing.T, key string, retryAfter *string) llm.Provider {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if retryAfter != nil {
			w.Header().Set("Retry-After", *retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
	}))
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: key})
	require.NoError(t, err)
	return p
}

// Retry-After with sense. A hint far longer than retry.max_retry_after (5 minutes) pushes the
// credential's shared schedule back by 5 minutes only, and the job waits 5 minutes at most; a job
// whose deadline comes first fails at once. A malformed Retry-After is a retry without a hint
// (full jitter), logged once with its value, and neither a dead letter nor a pause. A 429 without
// Retry-After stays a spend cap.
func TestExecutor_RetryAfterWithSense(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	huge, malformed := "99999999", "-5"
	logFile := filepath.Join(t.TempDir(), "log")
	logs, err := os.Create(logFile)
	require.NoError(t, err)
	t.Cleanup(func() { _ = logs.Close() })
	upstream := func(name string, p llm.Provider) executor.Upstream {
		return executor.Upstream{Name: name, Kind: string(llm.KindAnthropic), Provider: p,
			Gate: lim.Gate("sk-"+name, name), Circuit: brk.Circuit("sk-"+name, name)}
	}
	ex := executor.New(executor.Config{Store: b.Store, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Policy: retrypolicy.New(&retrypolicy.Config{Float64: func() float64 { return 0.5 }}),
		Upstreams: map[string]executor.Upstream{
			"huge":      upstream("huge", always429(t, "sk-huge", &huge)),
			"huge2":     upstream("huge2", always429(t, "sk-huge2", &huge)),
			"malformed": upstream("malformed", always429(t, "sk-malformed", &malformed)),
			"capped":    upstream("capped", always429(t, "sk-capped", nil)),
		}})
	run := func(t *testing.T, credential string, timeout time.Duration) (*jobs.Job, error) {
		t.Helper()
		return process(t, b, ex, credential, 5, timeout)
	}
	// retried runs a job that must come back for a retry, and returns it.
	retried := func(t *testing.T, credential string) *jobs.Job {
		t.Helper()
		job, err := run(t, credential, time.Hour)
		var deferred *dispatch.DeferError
		require.ErrorAs(t, err, &deferred)
		require.Equal(t, jobs.StatusRetrying, job.Status, "retried, not dead-lettered")
		require.NotNil(t, job.NextAttemptAt)
		return job
	}

	t.Run("HugeHintCapped", func(t *testing.T) {
		t.Parallel()
		// When a job with an hour to live gets "Retry-After: 99999999"
		before := time.Now()
		job := retried(t, "huge")

		// Then it is retried after 5 minutes at most (the spread within the cap's last 5s)
		require.WithinRange(t, *job.NextAttemptAt, before.Add(5*time.Minute-5*time.Second), time.Now().Add(5*time.Minute))
		// and the credential's schedule is pushed back by 5 minutes, not an hour, and says why.
		pb, err := lim.Gate("sk-huge", "huge").PushBack(ctx)
		require.NoError(t, err)
		require.WithinRange(t, pb.Until, before.Add(5*time.Minute-time.Second), time.Now().Add(5*time.Minute+time.Second))
		require.Equal(t, "Retry-After 3600s from a 429, capped at 300s", pb.Reason())

		// A job whose deadline comes before the capped wait is answered now: failed, deadline.
		// (On a credential of its own: the push-back above would hold it before any call.)
		job, err = run(t, "huge2", 2*time.Minute)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusFailed, job.Status)
		require.Equal(t, jobs.ReasonDeadlineExceeded, job.LastError.Class)
	})

	t.Run("MalformedIsRetriedNotASpendCap", func(t *testing.T) {
		t.Parallel()
		before := time.Now()
		job := retried(t, "malformed")
		require.Nil(t, job.DeadReason)
		require.Equal(t, string(retrypolicy.ClassRetryable), job.LastError.Class)
		require.Nil(t, job.LastError.RetryAfterMS, "no hint")
		// full jitter, U(0, 500ms) for a first retry: r = 0.5 gives 250ms
		require.WithinRange(t, *job.NextAttemptAt, before.Add(250*time.Millisecond), time.Now().Add(250*time.Millisecond))
		gate := lim.Gate("sk-malformed", "malformed")
		ps, err := gate.Paused(ctx)
		require.NoError(t, err)
		require.False(t, ps.Paused, "the credential is not paused")
		pb, err := gate.PushBack(ctx)
		require.NoError(t, err)
		require.False(t, pb.Active(), "nor its schedule pushed back")
		logged, err := os.ReadFile(logFile)
		require.NoError(t, err)
		require.Equal(t, 1, strings.Count(string(logged), `"retry_after":"-5"`), "logged once, with the header's value: %s", logged)
	})

	t.Run("NoRetryAfterIsASpendCap", func(t *testing.T) {
		t.Parallel()
		job, err := run(t, "capped", time.Hour)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, job.Status)
		require.Equal(t, retrypolicy.DeadReasonRateLimitedNoRetryAfter, *job.DeadReason)
		ps, err := lim.Gate("sk-capped", "capped").Paused(ctx)
		require.NoError(t, err)
		require.True(t, ps.Paused)
	})
}
