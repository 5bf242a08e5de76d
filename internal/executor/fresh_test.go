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
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// freshJob commits a job of helloRequest on credential "default" and returns it as a Handoff
// gets it: the job Create returned (with the request it was created with).
func freshJob(t *testing.T, b *jobstest.Bundle) *jobs.Job {
	t.Helper()
	job, _, err := b.Store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	return job
}

// freshSetup returns a job store and an executor with one credential, "default", on a simulator
// answering key, and the credential's gate; the executor's metrics go to reg.
func freshSetup(t *testing.T, key string, reg *prometheus.Registry) (*jobstest.Bundle, *executor.Executor, *limiter.Gate) {
	t.Helper()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	gate := lim.Gate(key, "default")
	ex := executor.New(executor.Config{Store: b.Store, Metrics: executor.NewMetrics(reg), Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: simProvider(t, llmsim.Config{}, key),
			Gate: gate, Circuit: brk.Circuit(key, "default")},
	}})
	return b, ex, gate
}

// A handed-over first delivery (ProcessFresh) runs the job from the row its creator holds: it
// stores the answer without reading the job first, and records its pick-up once.
func TestExecutor_ProcessFreshRunsWithoutReadingTheJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	b, ex, _ := freshSetup(t, "sk-fresh", reg)
	job := freshJob(t, b)

	require.NoError(t, ex.ProcessFresh(ctx, job))

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, 1, got.Attempts)
	require.NotEmpty(t, got.Result)
	stages := stageCounts(t, reg)
	require.Zero(t, stages[executor.StageLoad], "the job was not read")
	require.Equal(t, uint64(1), stages[executor.StagePickup])
	require.Equal(t, uint64(1), stages[executor.StageCall])
}

// A handed-over delivery that must wait answers as a task's would: a *dispatch.DeferError, with
// the time written in the job row for the task that comes back.
func TestExecutor_ProcessFreshDefersLikeAProcess(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, ex, gate := freshSetup(t, "sk-fresh-paused", prometheus.NewRegistry())
	_, err := gate.Pause(ctx, "spend_cap", "")
	require.NoError(t, err)
	job := freshJob(t, b)

	err = ex.ProcessFresh(ctx, job)

	var d *dispatch.DeferError
	require.ErrorAs(t, err, &d)
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)
	require.Zero(t, got.Attempts)
	require.NotNil(t, got.NextAttemptAt, "the deferral's time is in the row")
	require.WithinDuration(t, d.Until, *got.NextAttemptAt, time.Millisecond)
}

// A job canceled between its commit and its handed-over delivery is not sent: the attempt's
// start is conditional on the row, which the delivery did not read.
func TestExecutor_ProcessFreshSkipsACanceledJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	b, ex, _ := freshSetup(t, "sk-fresh-cancel", reg)
	job := freshJob(t, b)
	_, err := b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)

	require.NoError(t, ex.ProcessFresh(ctx, job))

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Zero(t, got.Attempts)
	require.Zero(t, stageCounts(t, reg)[executor.StageCall], "the provider was not called")
}
