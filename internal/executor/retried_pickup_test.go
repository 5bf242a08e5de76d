package executor_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// A dead job an operator retried is queued with no attempts again, but its delivery is not a
// pick-up: the pick-up stage (creation to first delivery) would count the days it lay dead as
// the queue's pick-up latency, one retried dead letter skewing the histogram for good.
func TestExecutor_ARetriedDeadJobIsNoPickup(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, brk := sharedAdmission(t, rdb)
	p := simProvider(t, llmsim.Config{}, "sk-retried")
	reg := prometheus.NewRegistry()
	ex := executor.New(executor.Config{Store: b.Store, Metrics: executor.NewMetrics(reg), Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p,
			Gate: lim.Gate("sk-retried", "default"), Circuit: brk.Circuit("sk-retried", "default")},
	}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRateLimitedNoRetryAfter})
	retried, err := b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{job.ID}}, nil)
	require.NoError(t, err)
	require.Len(t, retried, 1)

	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	done, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, done.Status)
	got := stageCounts(t, reg)
	require.Equal(t, uint64(1), got[executor.StageCall], "the retried job was delivered and called")
	require.Zero(t, got[executor.StagePickup], "no pick-up recorded for a retried dead job")
}
