package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
)

// budgetCutRig is a limiter with metrics on a client whose connection can lose a reply
// (redistest.CutClient), and the gate of credential "sk-cut" on it, with budget as its retry
// budget.
type budgetCutRig struct {
	testBundle
	ctx  context.Context
	gate *limiter.Gate
	cut  *redistest.Cutter
}

func newBudgetCutRig(t *testing.T, budget limiter.Budget) *budgetCutRig {
	t.Helper()
	r := &budgetCutRig{testBundle: testBundle{clock: clocktest.New(t0), prefix: redistest.Prefix(t),
		reg: prometheus.NewRegistry()}}
	rdb, cut := redistest.CutClient(t)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: r.prefix, Now: r.clock.Now, Budget: budget,
		Metrics: limiter.NewMetrics(r.reg)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	r.ctx, r.lim, r.gate, r.cut = ctx, lim, lim.Gate("sk-cut", "main"), cut
	// Redis caches the script first (an EVALSHA that finds it missing runs nothing).
	_, err = lim.Gate("sk-warm", "warm").AllowRetry(ctx, "warm")
	require.NoError(t, err)
	return r
}

// allowCut asks the budget for retry as AllowRetry does, the reply of its first run lost: go-redis
// sends it again on a new connection, after Redis ran it.
func (r *budgetCutRig) allowCut(t *testing.T, retry string) bool {
	t.Helper()
	r.cut.Arm(r.prefix + redisscript.CredentialTag("sk-cut") + ":budget")
	ok, err := r.gate.AllowRetry(r.ctx, retry)
	require.NoError(t, err)
	require.Equal(t, 1, r.cut.Cuts(), "the draw's reply was lost")
	return ok
}

// A retry's draw whose reply is lost after Redis ran it is sent again by go-redis. The retry is
// granted once and draws once: the second run finds its grant. It drew twice, spending a retry
// of the budget that no request used.
func TestGate_AllowRetryLostReplyDrawsOnce(t *testing.T) {
	t.Parallel()
	r := newBudgetCutRig(t, limiter.Budget{Floor: 2, Ratio: 0.001})
	require.True(t, r.allowCut(t, "job-1:1"), "the retry got the grant its first run drew")
	ok, err := r.gate.AllowRetry(r.ctx, "job-2:1")
	require.NoError(t, err)
	require.True(t, ok, "one of the floor's two retries is left")
	ok, err = r.gate.AllowRetry(r.ctx, "job-3:1")
	require.NoError(t, err)
	require.False(t, ok, "both are spent")
}

// A retry's refusal whose reply is lost is sent again by go-redis. The refusal is counted once in
// llmq_retry_budget_refusals_total, as when its reply arrives: the second run found the retry
// already refused (its first run's), and it was counted nowhere.
func TestGate_AllowRetryLostReplyCountsTheRefusal(t *testing.T) {
	t.Parallel()
	r := newBudgetCutRig(t, limiter.Budget{Floor: -1, Ratio: 0.001})
	require.False(t, r.allowCut(t, "job-1:1"))
	require.Equal(t, 1.0, r.metric(t, "llmq_retry_budget_refusals_total", "main"))

	// Asked again, the retry is not counted again.
	ok, err := r.gate.AllowRetry(r.ctx, "job-1:1")
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, 1.0, r.metric(t, "llmq_retry_budget_refusals_total", "main"))
}

// A retry granted and asked for again within the window (its delivery came back before sending
// it: its send slot was far off, say) is granted again without a second draw, and a look at it
// answers true: one retry sent, one retry drawn. Another retry, of the same job after its next
// attempt or of another job, draws as before.
func TestGate_AllowRetryDrawsOncePerRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *limiter.Config) { c.Budget = limiter.Budget{Floor: 2, Ratio: 0.001} })
	ctx := t.Context()
	g, g2 := b.lim.Gate("sk-once", "main"), b.lim2.Gate("sk-once", "main")
	for _, c := range []*limiter.Gate{g, g2, g} { // any process, any number of times
		ok, err := c.AllowRetry(ctx, "job-1:1")
		require.NoError(t, err)
		require.True(t, ok)
	}
	ok, err := g.RetryAllowed(ctx, "job-1:1", nil)
	require.NoError(t, err)
	require.True(t, ok, "the retry has its draw")
	ok, err = g.AllowRetry(ctx, "job-1:2")
	require.NoError(t, err)
	require.True(t, ok, "the job's next retry draws the floor's second")
	ok, err = g.AllowRetry(ctx, "job-2:1")
	require.NoError(t, err)
	require.False(t, ok, "the floor is spent: two retries drawn")
	ok, err = g.RetryAllowed(ctx, "job-1:1", nil)
	require.NoError(t, err)
	require.True(t, ok, "a spent budget still lets a retry granted within the window go")

	// A window later the grant is gone with the retries it counted: the retry draws again.
	b.clock.Advance(time.Minute + time.Second)
	ok, err = g.AllowRetry(ctx, "job-1:1")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = g.AllowRetry(ctx, "job-3:1")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = g.AllowRetry(ctx, "job-4:1")
	require.NoError(t, err)
	require.False(t, ok, "the window's two: job-1:1's draw again and job-3:1's")
}
