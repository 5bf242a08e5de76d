package executor_test

import (
	"context"
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

// A slot granted at or after the job's deadline (here behind a 5-minute Retry-After push-back,
// the deadline 2 minutes away) fails the job at once, deadline_exceeded, instead of holding the
// slot and waiting queued until after its own deadline.
func TestExecutor_SlotAfterTheDeadlineFailsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	gate := lim.Gate("sk-pushed", "pushed")
	require.NoError(t, gate.Observe(ctx, limiter.Observation{StatusCode: 429, HasRetryAfter: true, RetryAfter: 5 * time.Minute}))
	ok := "0"
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil),
		Upstreams: map[string]executor.Upstream{"pushed": {Name: "pushed", Kind: string(llm.KindAnthropic),
			Provider: always429(t, "sk-pushed", &ok), Gate: gate, Circuit: brk.Circuit("sk-pushed", "pushed")}}})

	job, err := process(t, b, ex, "pushed", 5, 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusFailed, job.Status)
	require.Equal(t, jobs.ReasonDeadlineExceeded, job.LastError.Class)
	require.Zero(t, job.Attempts, "nothing was sent")

	// A job whose deadline comes after the slot waits for it, as before.
	job, err = process(t, b, ex, "pushed", 5, 10*time.Minute)
	var deferred *dispatch.DeferError
	require.ErrorAs(t, err, &deferred)
	require.Equal(t, jobs.StatusQueued, job.Status)
}

// A retry whose slot is the probe of a limit being learned, refused by the retry budget once the
// slot is granted (fair queueing draws on it then), hands the probe on at once: the credential's
// other attempts do not wait out the probe's hold (30 s) for an answer that will never come.
func TestExecutor_UnsentProbeIsHandedOn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	clock := clocktest.New(time.Now())
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now})
	require.NoError(t, err)
	gate := lim.Gate("sk-probe", "probe")
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil), Now: clock.Now,
		TenantWeight: func(context.Context, string) (int, error) { return 1, nil },
		Upstreams: map[string]executor.Upstream{"probe": {Name: "probe", Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-probe"), Gate: gate}}})
	job := b.Create(t, jobstest.Opts{Credential: "probe", Timeout: time.Hour})
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying}) // failed once: the next is a retry
	// Spend the retry budget.
	for range 1000 {
		ok, err := gate.AllowRetry(ctx)
		require.NoError(t, err)
		if !ok {
			break
		}
	}
	ok, err := gate.AllowRetry(ctx)
	require.NoError(t, err)
	require.False(t, ok, "the retry budget is spent")

	err = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, err, &deferred)
	require.Contains(t, deferred.Reason, "retry budget spent")

	clock.Advance(time.Second)
	r, err := gate.Reserve(ctx, limiter.Limit{})
	require.NoError(t, err)
	require.True(t, r.Granted && r.Probe, "the next attempt is the probe: %+v", r)
}
