package executor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
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

// TestExecutor_TooLargeForItsCredentialFailsOver: a request that can never fit its credential's
// token limits (helloRequest's 16 output tokens, over a configured 8 a minute) goes to the job's
// next fallback, whose limits may be larger, rather than failing the job (it failed with a
// fallback able to take it). Nothing was sent on the small credential: its breaker counts
// nothing and holds no cold-start slot of it. Without a fallback left, the job fails unsent as
// before.
func TestExecutor_TooLargeForItsCredentialFailsOver(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, brk := sharedAdmission(t, rdb)
	est, err := estimator.New(nil)
	require.NoError(t, err)
	small := limiter.Limit{Rate: 100, Burst: 10, OutputTokensPerMinute: 8}
	large := limiter.Limit{Rate: 100, Burst: 10, OutputTokensPerMinute: 1000}
	upstream := func(name string, limit limiter.Limit) executor.Upstream {
		return executor.Upstream{Name: name, Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-"+name), Gate: lim.Gate("sk-"+name, name),
			Circuit: brk.Circuit("sk-"+name, name), Limit: limit}
	}
	// Each subtest has credentials of its own: a breaker's cold-start slot of the other's job
	// would be counted in the other's.
	ups := map[string]executor.Upstream{"small": upstream("small", small),
		"smaller": upstream("smaller", small), "large": upstream("large", large),
		"tiny": upstream("tiny", small), "tinier": upstream("tinier", small)}
	ex := executor.New(executor.Config{Store: b.Store, Estimator: est, Upstreams: ups})
	// untouched requires that the breakers of names count nothing of the jobs that left them.
	untouched := func(t *testing.T, names ...string) {
		t.Helper()
		for _, name := range names {
			st, err := ups[name].Circuit.Status(ctx)
			require.NoError(t, err)
			require.Equal(t, breaker.Closed, st.State, name)
			require.Zero(t, st.Failures, name)
			require.Zero(t, st.InFlight, "%s: a cold-start slot was kept", name)
		}
	}

	t.Run("Fallback", func(t *testing.T) {
		t.Parallel()
		// Given a job on "small" with fallbacks "smaller" (too small too) and "large",
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "small",
			Fallbacks: []string{"smaller", "large"}, Request: helloRequest, MaxAttempts: 1,
			Timeout: time.Hour})
		require.NoError(t, err)
		// when it is delivered,
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		// then "large" answers it, in its one attempt,
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
		require.Equal(t, "large", *got.AnsweredBy)
		require.Equal(t, 1, got.Attempts, "a credential too small counted an attempt")
		// and the credentials it left count nothing of it.
		untouched(t, "small", "smaller")
	})
	t.Run("NoFallback", func(t *testing.T) {
		t.Parallel()
		// Given a job on "tiny" whose only fallback, "tinier", is too small too,
		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "tiny",
			Fallbacks: []string{"tinier"}, Request: helloRequest, MaxAttempts: 1,
			Timeout: time.Hour})
		require.NoError(t, err)
		// when it is delivered,
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		// then it fails unsent, on the last credential it tried.
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusFailed, got.Status)
		require.Contains(t, got.LastError.Message, "request can never be sent")
		require.Zero(t, got.Attempts)
		require.Equal(t, "tinier", got.CurrentCredential())
		untouched(t, "tiny", "tinier")
	})
}
