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
	"github.com/llmq/llmq/internal/tokens"
)

// TestExecutor_RetryBackForItsSlotDrawsOnce: a retry draws on the budget before it asks for its
// send slot (outside fair queueing); while the credential's limit is being learned (its probe out)
// the slot is refused and the delivery comes back for it. Each coming back drew the retry again:
// three deliveries of one retry spent three of the budget's retries, and the other jobs' retries
// were refused for retries never sent. The retry draws once.
func TestExecutor_RetryBackForItsSlotDrawsOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := jobstest.New(t)
	clock := clocktest.New(time.Now())
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now,
		Budget: limiter.Budget{Floor: 2, Ratio: 0.001}})
	require.NoError(t, err)
	gate := lim.Gate("sk-probe", "probe")
	// Waits longer than a millisecond are deferred, not slept (the test's clock stands still).
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil), Now: clock.Now, MaxInlineWait: time.Millisecond,
		Upstreams: map[string]executor.Upstream{"probe": {Name: "probe", Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-probe"), Gate: gate}}})
	// The limit is unknown and its probe is out: every other ask waits for the probe's answer.
	probe, err := gate.ReserveAttempt(ctx, limiter.Limit{}, tokens.Cost{}, limiter.AttemptOptions{})
	require.NoError(t, err)
	require.True(t, probe.Probe)

	job := b.Create(t, jobstest.Opts{Credential: "probe", Timeout: time.Hour})
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying}) // failed once: the next is a retry
	for range 3 {
		err := ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
		var deferred *dispatch.DeferError
		require.ErrorAs(t, err, &deferred)
		require.Contains(t, deferred.Reason, "waiting for a send slot")
		clock.Advance(time.Second)
	}
	ok, err := gate.AllowRetry(ctx, "other:1")
	require.NoError(t, err)
	require.True(t, ok, "the job's retry drew one of the floor's two")
	ok, err = gate.AllowRetry(ctx, "another:1")
	require.NoError(t, err)
	require.False(t, ok, "the floor is spent")
}
