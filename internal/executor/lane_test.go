package executor_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// TestExecutor_DropsBatchLaneTask: a stray task for a batch-lane job (the batcher owns it) is
// dropped: no provider call, no limiter slot, no attempt, the job untouched.
func TestExecutor_DropsBatchLaneTask(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-lane"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p,
			Gate: lim.Gate("sk-lane", "default"), Circuit: brk.Circuit("sk-lane", "default")}}})
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour, Lane: jobs.LaneBatch})
	require.NoError(t, err)

	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)
	require.Zero(t, got.Attempts)
	require.Nil(t, got.SlotSeq, "no limiter slot taken")
	require.Zero(t, sim.Stats().Requests)
}
