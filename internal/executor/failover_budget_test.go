package executor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
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

// TestExecutor_FailoverForSizeOrSpendCapSkipsTheRetryBudget: the retry budget holds back retries
// against a failing provider. A job moved to its fallback because its first credential refused
// the request as too large, or answered with a spend cap, retries nothing against the
// fallback: its attempt there is sent although the fallback's retry budget is spent.
func TestExecutor_FailoverForSizeOrSpendCapSkipsTheRetryBudget(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	for _, tt := range []struct {
		name  string
		first llmsim.Config
	}{
		{"SizeRefusal", llmsim.Config{ContextTokens: 5}},
		{"SpendCap", llmsim.Config{Faults: llmsim.Faults{SpendCap: true}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			clock := clocktest.New(time.Now())
			lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now})
			require.NoError(t, err)
			fallback := lim.Gate("sk-fallback", "fallback")
			// Given a fallback whose retry budget is spent,
			spendRetryBudget(t, fallback)
			ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil), Now: clock.Now,
				Upstreams: map[string]executor.Upstream{
					"first": {Name: "first", Kind: string(llm.KindAnthropic),
						Provider: simProvider(t, tt.first, "sk-first"), Gate: lim.Gate("sk-first", "first")},
					"fallback": {Name: "fallback", Kind: string(llm.KindAnthropic),
						Provider: simProvider(t, llmsim.Config{}, "sk-fallback"), Gate: fallback},
				}})
			job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "first",
				Fallbacks: []string{"fallback"}, Request: longRequest, MaxAttempts: 3, Timeout: time.Hour})
			require.NoError(t, err)
			// when the first credential's answer moves the job there,
			var deferred *dispatch.DeferError
			require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
			got, err := b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Equal(t, "fallback", got.CurrentCredential(), "last error: %+v", got.LastError)
			// its next delivery is answered there, not held back by the fallback's budget.
			require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
			got, err = b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
			require.Equal(t, "fallback", *got.AnsweredBy)
		})
	}
}
