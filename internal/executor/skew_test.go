package executor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// A slot held in the job row (its send time further off than a delivery sleeps) is sent at its
// time on the limiter's clock, whichever worker delivers the job again: one whose clock runs
// ahead of the holder's must not send it early, into the provider's rate limit. Two workers share
// Postgres and the limiter (on Redis TIME); the second's clock is 8 s ahead.
func TestExecutor_HeldSlotWaitsOnTheLimitersClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, _ := sharedAdmission(t, redistest.Client(t))
	p := simProvider(t, llmsim.Config{}, "sk-held-skew")
	upstreams := map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: lim.Gate("sk-held-skew", "default"),
			Limit: limiter.Limit{Rate: 0.1, Burst: 1}}, // one request per 10 s
	}
	const skew = 8 * time.Second
	holder := executor.New(executor.Config{Store: b.Store, Upstreams: upstreams})
	ahead := executor.New(executor.Config{Store: b.Store, Upstreams: upstreams,
		Now: func() time.Time { return time.Now().Add(skew) }})

	first := createJob(t, b, "acme", jobs.PriorityNormal)
	require.NoError(t, holder.Process(ctx, dispatch.Delivery{JobID: first.ID}), "the burst's slot")
	job := createJob(t, b, "acme", jobs.PriorityNormal)
	var d *dispatch.DeferError
	require.ErrorAs(t, holder.Process(ctx, dispatch.Delivery{JobID: job.ID}), &d, "its slot is 10 s away")
	held, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.NotNil(t, held.SlotSeq, "the slot is held in the row")

	// The worker ahead gets the job again (asynq, on its clock, hands it over when due there).
	err = ahead.Process(ctx, dispatch.Delivery{JobID: job.ID})
	got, gerr := b.Store.Get(ctx, job.ID)
	require.NoError(t, gerr)
	require.Zero(t, got.Attempts, "not sent before its slot: %v", err)
	require.ErrorAs(t, err, &d, "deferred to the slot's time")
	require.WithinDuration(t, time.Now().Add(skew+10*time.Second), d.Until, 2*time.Second,
		"on the clock of the worker it goes back to")
}
