package executor_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// TestExecutor_RetryDeferredByTheBudgetIsOneRefusal: llmq_retry_budget_refusals_total says
// "retries refused", but counted each look again at a retry the spent budget deferred (one a
// second): one retry deferred three times counted 3. It counts the retry once; the job's next
// retry, refused too, counts once more.
func TestExecutor_RetryDeferredByTheBudgetIsOneRefusal(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	clock := clocktest.New(time.Now())
	reg := prometheus.NewRegistry()
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now,
		Metrics: limiter.NewMetrics(reg)})
	require.NoError(t, err)
	gate := lim.Gate("sk-spent", "spent")
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil), Now: clock.Now,
		Upstreams: map[string]executor.Upstream{"spent": {Name: "spent", Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-spent"), Gate: gate}}})
	refusals := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "llmq_retry_budget_refusals_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	// Spend the retry budget (the floor: no first attempt counted).
	spendRetryBudget(t, gate)
	require.Equal(t, 1.0, refusals(), "the spending's own refusal")

	job := b.Create(t, jobstest.Opts{Credential: "spent", Timeout: time.Hour})
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying}) // failed once: the next is a retry
	for range 3 {
		err := ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
		var deferred *dispatch.DeferError
		require.ErrorAs(t, err, &deferred)
		require.Contains(t, deferred.Reason, "retry budget spent")
		clock.Advance(time.Second)
	}
	require.Equal(t, 2.0, refusals(), "one retry deferred three times is one refusal")

	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying}) // its retry failed: a new one
	err = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, err, &deferred)
	require.Equal(t, 3.0, refusals(), "the job's next retry is refused too")
}
