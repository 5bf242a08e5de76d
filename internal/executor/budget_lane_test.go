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

// laneBudget is a credential "lane" under fair queueing (every tenant of weight 1) on a frozen
// clock: the limiter's slots move only when the test advances it, and a slot not due now is a
// deferral (nothing waits in process on that clock).
type laneBudget struct {
	b     *jobstest.Bundle
	clock *clocktest.Clock
	gate  *limiter.Gate
	ex    *executor.Executor
}

func newLaneBudget(t *testing.T, limit limiter.Limit) *laneBudget {
	t.Helper()
	lb := &laneBudget{b: jobstest.New(t), clock: clocktest.New(time.Now())}
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: lb.clock.Now})
	require.NoError(t, err)
	lb.gate = lim.Gate("sk-lane", "lane")
	lb.ex = executor.New(executor.Config{Store: lb.b.Store, Policy: retrypolicy.New(nil), Now: lb.clock.Now,
		MaxInlineWait: time.Millisecond,
		Upstreams: map[string]executor.Upstream{"lane": {Name: "lane", Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-lane"), Gate: lb.gate, Limit: limit}},
		TenantWeight: func(context.Context, string) (int, error) { return 1, nil }})
	return lb
}

// timedOut commits a job of tenant whose first attempt timed out: its next attempt is a retry
// that draws on the timeouts' allowance.
func (lb *laneBudget) timedOut(t *testing.T, tenant string) *jobs.Job {
	t.Helper()
	job := lb.b.Create(t, jobstest.Opts{Credential: "lane", Tenant: tenant, Timeout: time.Hour})
	lb.b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying, LastError: &jobs.LastError{
		Class: string(retrypolicy.ClassTimeout), Message: "attempt timed out"}})
	return job
}

// spendTimeouts spends the timeouts' allowance (its floor while no first attempt is counted).
func (lb *laneBudget) spendTimeouts(ctx context.Context, t *testing.T) {
	t.Helper()
	for spent := false; !spent; {
		ok, err := lb.gate.AllowTimeoutRetry(ctx, "")
		require.NoError(t, err)
		spent = !ok
	}
}

// deferred runs a delivery of job, which must be deferred, and returns why.
func (lb *laneBudget) deferred(ctx context.Context, t *testing.T, job *jobs.Job) string {
	t.Helper()
	var df *dispatch.DeferError
	require.ErrorAs(t, lb.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &df)
	return df.Reason
}

// sent commits a job of tenant and runs its delivery, which must send it at once.
func (lb *laneBudget) sent(ctx context.Context, t *testing.T, tenant string) {
	t.Helper()
	job := lb.b.Create(t, jobstest.Opts{Credential: "lane", Tenant: tenant, Timeout: time.Hour, Request: helloRequest})
	require.NoError(t, lb.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), "tenant %s", tenant)
	got, err := lb.b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status, "tenant %s", tenant)
}

// TestExecutor_RetryRefusedByTheBudgetHoldsNoLaneBack: under fair queueing a retry asked for its
// slot before drawing on the retry budget, so a retry the spent budget refused had put its
// ticket in its lane, ahead (by creation time) of every newer job of its tenant, and had used a
// slot; the newer first attempts waited behind retries draining at the budget's rate, on a
// healthy provider with the rate limit idle. A retry the budget refuses now takes neither slot
// nor ticket: the first attempts after it, of its lane and of another, are sent at once.
func TestExecutor_RetryRefusedByTheBudgetHoldsNoLaneBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	lb := newLaneBudget(t, limiter.Limit{Rate: 1, Burst: 2}) // two slots now, one a second after
	lb.spendTimeouts(ctx, t)
	var retries []*jobs.Job
	for range 4 {
		retries = append(retries, lb.timedOut(t, "acme"))
	}
	var reasons []string
	for _, job := range retries {
		reasons = append(reasons, lb.deferred(ctx, t, job))
	}

	lb.sent(ctx, t, "acme")
	lb.sent(ctx, t, "other")
	for i, job := range retries {
		require.Contains(t, reasons[i], "timeout retry budget spent")
		got, err := lb.b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusRetrying, got.Status)
		require.Equal(t, 1, got.Attempts, "a refused retry is not sent")
	}
}

// TestExecutor_RetryRefusedByTheBudgetGivesUpItsTicket: a retry the budget allowed may be told to
// come back for its turn, its ticket left first in its lane; should the budget be spent when it
// comes back, it waits for the budget, and its ticket, ranked before every newer job of its
// tenant, would have held them back until its deadline. The refusal takes the ticket out.
func TestExecutor_RetryRefusedByTheBudgetGivesUpItsTicket(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	limit := limiter.Limit{Rate: 1, Burst: 1} // a slot a second
	lb := newLaneBudget(t, limit)
	retry := lb.timedOut(t, "acme")
	// Another tenant's attempt takes this second's slot: the retry, allowed by the budget, is told
	// to come back for its turn, and its ticket waits first in its lane.
	r, err := lb.gate.ReserveAttempt(ctx, limit, tokens.Cost{}, limiter.AttemptOptions{Lane: &limiter.Lane{
		Tenant: "other", Ticket: "other-job", Since: lb.clock.Now()}})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Contains(t, lb.deferred(ctx, t, retry), "waiting for a send slot")

	// Other retries spend the budget; the retry comes back once a slot is free, and is refused.
	lb.spendTimeouts(ctx, t)
	lb.clock.Advance(2 * time.Second)
	require.Contains(t, lb.deferred(ctx, t, retry), "timeout retry budget spent")

	lb.sent(ctx, t, "acme") // a newer job of its tenant takes the free slot
}
