package executor_test

import (
	"context"
	"errors"
	"sync"
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
	"github.com/llmq/llmq/internal/tokens"
)

// With TenantWeight set, an attempt asks in its lane: when its turn is not within the horizon it
// takes no slot far ahead (none is held in the job row, unlike a FIFO reservation) and is
// deferred to ask again; the weight is the job's tenant's. A failing weight lookup reserves
// nothing and fails the delivery (dispatch retries it).
func TestExecutor_FairLane(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	p := simProvider(t, llmsim.Config{}, "sk-fair")
	limit := limiter.Limit{Rate: 0.1, Burst: 1} // one request per 10 s
	gate := lim.Gate("sk-fair", "default")
	var mu sync.Mutex
	var asked []string
	weightErr := error(nil)
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate, Limit: limit,
			Circuit: brk.Circuit("sk-fair", "default")},
	}, TenantWeight: func(_ context.Context, tenant string) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, tenant)
		return 2, weightErr
	}})

	// Another tenant's attempt takes the only slot of the next 10 s.
	r, err := gate.ReserveAttempt(ctx, limit, tokens.Cost{}, limiter.AttemptOptions{Lane: &limiter.Lane{
		Tenant: "other", Priority: limiter.PriorityLow, Ticket: "other-job", Since: time.Now()}})
	require.NoError(t, err)
	require.True(t, r.Granted)

	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "acme", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour, Priority: jobs.PriorityHigh})
	require.NoError(t, err)
	perr := ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	var df *dispatch.DeferError
	require.ErrorAs(t, perr, &df)
	require.Contains(t, df.Reason, "waiting for a send slot")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Nil(t, got.SlotSeq, "no slot held far ahead")
	require.NotNil(t, got.NextAttemptAt)
	require.Equal(t, []string{"acme"}, asked)

	// A weight that cannot be read: the delivery fails on the store, nothing is reserved.
	mu.Lock()
	weightErr = errors.New("postgres unreachable")
	mu.Unlock()
	other, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "acme", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	perr = ex.Process(ctx, dispatch.Delivery{JobID: other.ID})
	require.ErrorContains(t, perr, "postgres unreachable")
	got, err = b.Store.Get(ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)
	require.Nil(t, got.SlotSeq)
}
