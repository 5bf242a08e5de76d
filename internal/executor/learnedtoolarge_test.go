package executor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// TestExecutor_TooLargeForALearnedLimitSaysSo: submit cannot refuse a request over a token limit
// llmq only learned from the provider's headers (none configured; see docs/decisions.md, "Submit
// accepts a request over a learned limit"), so such a job fails unsent at its delivery on its last
// credential, and its error says that the limit was learned, not configured: it may change, and
// the operator who reads it knows no configuration refused it.
func TestExecutor_TooLargeForALearnedLimitSaysSo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, _ := sharedAdmission(t, redistest.Client(t))
	est, err := estimator.New(nil)
	require.NoError(t, err)
	// Given a credential with no token limit configured, whose provider allows 8 input tokens a
	// minute,
	gate := lim.Gate("sk-learned", "learned")
	ex := executor.New(executor.Config{Store: b.Store, Estimator: est, Upstreams: map[string]executor.Upstream{
		"learned": {Name: "learned", Kind: string(llm.KindAnthropic), Gate: gate,
			Provider: simProvider(t, llmsim.Config{InputTokensPerMinute: 8, OutputTokensPerMinute: 1000}, "sk-learned"),
			Limit:    limiter.Limit{Rate: 100, Burst: 10}},
	}})
	run := func(request []byte) *jobs.Job {
		t.Helper()
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "learned",
			Request: request, MaxAttempts: 3, Timeout: time.Hour})
		require.NoError(t, err)
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		return got
	}
	// whose limit a first answer taught the gate,
	require.Equal(t, jobs.StatusSucceeded, run(helloRequest).Status)
	buckets, err := gate.CurrentTokenBuckets(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceLearned, buckets.Input.Source)
	// when a request of 10 input tokens is delivered,
	got := run(longRequest)
	// then it fails unsent, saying the limit it exceeds was learned from the provider.
	require.Equal(t, jobs.StatusFailed, got.Status)
	require.Zero(t, got.Attempts, "it was sent")
	require.Equal(t, "request can never be sent: request needs 10 input tokens but the credential's whole input_tokens "+
		"limit is 8 per minute: it can never be sent (a limit learned from the provider's rate-limit headers, "+
		"none configured: it may change)", got.LastError.Message)
}
