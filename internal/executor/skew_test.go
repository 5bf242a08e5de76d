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
	// The slot's time is the row's (on the limiter's clock, 10 s after the burst's slot was
	// taken): counted from the test's clock, the margin was what the test took since then,
	// which a loaded run can spend.
	require.NotNil(t, held.NextAttemptAt)
	require.WithinDuration(t, held.NextAttemptAt.Add(skew), d.Until, 2*time.Second,
		"on the clock of the worker it goes back to")
}

// Anthropic's reset times are on the provider's clock: a worker whose clock runs ahead of it
// learns the rate from the reset measured against the response's Date (the same clock), not
// against its own: else the refill looks shorter by the difference, the learned rate too high,
// and the credential's requests go out into 429s. The simulator (20 requests, 10 a second) is
// drained by 19 calls; the worker's probe takes the 20th, and its clock is 1.5 s ahead.
func TestExecutor_LearnsTheRateOnTheProvidersClock(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, _ := sharedAdmission(t, redistest.Client(t))
	const key = "sk-learn-skew"
	p := simProvider(t, llmsim.Config{Capacity: 20, RefillPerSecond: 10}, key)
	for range 19 {
		resp, err := p.Send(ctx, helloRequest, llm.SendOptions{})
		require.NoError(t, err)
		resp.Release()
	}
	gate := lim.Gate(key, "default")
	ahead := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate}}, // learned
		Now: func() time.Time { return time.Now().Add(1500 * time.Millisecond) }})

	job := createJob(t, b, "acme", jobs.PriorityNormal)
	require.NoError(t, ahead.Process(ctx, dispatch.Delivery{JobID: job.ID}), "the probe")
	got, src, err := gate.Current(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.SourceLearned, src)
	require.Equal(t, 20, got.Burst)
	require.LessOrEqual(t, got.Rate, 10.0, "no more than the provider refills")
}

// A held slot postponed once it was due (its credential paused, its breaker open) keeps it in the
// row with the recheck written on the postponing worker's clock, while the row's time is read on
// the limiter's: a worker X ahead makes the recheck X late, one X behind X early; never is the
// slot sent before its time, for it was due when postponed. Here the limiter's clock is the
// test's; the worker is 8 s ahead of it.
func TestExecutor_PostponedHeldSlotRecheckShiftsByTheSkew(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const skew = 8 * time.Second
	clock := clocktest.New(time.Now())
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now})
	require.NoError(t, err)
	gate := lim.Gate("sk-held-postpone", "held")
	p := simProvider(t, llmsim.Config{}, "sk-held-postpone")
	limit := limiter.Limit{Rate: 0.1, Burst: 1} // a slot every 10 s
	b := jobstest.New(t)
	upstreams := map[string]executor.Upstream{"held": {Name: "held", Kind: string(llm.KindAnthropic), Provider: p,
		Gate: gate, Limit: limit}}
	ahead := executor.New(executor.Config{Store: b.Store, Upstreams: upstreams, Float64: func() float64 { return 0 },
		Now: func() time.Time { return clock.Now().Add(skew) }})
	r, err := gate.Reserve(ctx, limit) // the test takes the slot at hand
	require.NoError(t, err)
	require.True(t, r.Granted)
	job := b.Create(t, jobstest.Opts{Credential: "held", Timeout: time.Hour, Request: helloRequest})
	var d *dispatch.DeferError
	require.ErrorAs(t, ahead.Process(ctx, dispatch.Delivery{JobID: job.ID}), &d)
	require.Contains(t, d.Reason, "rate limit slot")
	held, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.WithinDuration(t, clock.Now().Add(10*time.Second), *held.NextAttemptAt, time.Second, "the slot, on the limiter's clock")

	// The slot is due; the credential was paused meanwhile: the job is postponed, the slot kept.
	_, err = gate.Pause(ctx, "rate_limited_no_retry_after", "other")
	require.NoError(t, err)
	clock.Advance(11 * time.Second)
	require.ErrorAs(t, ahead.Process(ctx, dispatch.Delivery{JobID: job.ID}), &d)
	require.Contains(t, d.Reason, "credential paused")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.NotNil(t, got.SlotSeq, "the slot is kept")
	const recheck = 5 * time.Second // pausedRecheck, no spread
	require.WithinDuration(t, clock.Now().Add(skew+recheck), *got.NextAttemptAt, time.Second,
		"the recheck, on the worker's clock: the skew late on the limiter's")
	require.True(t, got.NextAttemptAt.After(*held.NextAttemptAt), "never before the slot")
}
