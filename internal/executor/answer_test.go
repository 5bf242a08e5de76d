package executor_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// A delivery gives its answer's bytes back to the worker's answer budget once the outcome is
// stored: with room for one answer only, jobs run one after the other, none waits for ever.
func TestExecutor_ReleasesTheAnswer(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	budget, err := llm.NewAnswerBudget(64<<10, 64<<10) // one answer at a time
	require.NoError(t, err)
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	t.Cleanup(sim.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: sim.URL, APIKey: "sk-answer",
		MaxResponseBytes: 64 << 10, AnswerBudget: budget})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p},
	}})
	for range 3 {
		job, err := process(t, b, ex, "default", 1, time.Minute)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, job.Status)
		require.Zero(t, budget.InUse(), "the stored answer's bytes are given back")
	}
}
