package batchlane_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// TestBatcher_DeadlineFallbackOnTheLastAttempt: a job whose batch has not ended when its deadline
// comes near, and that has no attempt left to go online with, fails deadline_exceeded: its
// deadline cut its batch, as a call's deadline cuts an online attempt (see
// executor.TestExecutor_CallCutByTheDeadlineFailsTheJob). It is not dead retries_exhausted (an
// operator's alert, and a `ctl dead retry --all` candidate, for a client's timeout).
func TestBatcher_DeadlineFallbackOnTheLastAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{delay: 5 * time.Hour})
	var dead []string
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics,
		Lanes: []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
		Enqueue: func(context.Context, string, jobs.Priority) error {
			t.Error("a job without an attempt left is not sent online")
			return nil
		},
		DeadLettered: func(_, reason string) { dead = append(dead, reason) }})
	job := b.submit(t, "x", 2*time.Hour, 1)
	b.clock.Advance(fill)
	once(t, bt)
	require.Equal(t, jobs.StatusRunning, b.get(t, job.ID).Status)

	b.clock.Set(job.Deadline.Add(-10 * time.Minute))
	once(t, bt)
	got := b.get(t, job.ID)
	require.Equal(t, jobs.StatusFailed, got.Status)
	require.Equal(t, jobs.ReasonDeadlineExceeded, got.LastError.Class)
	require.Equal(t, "deadline_fallback", got.LastError.Type)
	require.Empty(t, got.DeadReason)
	require.Empty(t, dead, "not a dead letter")
	require.Equal(t, 1.0, b.counter(t, "jobs", "failed"))
	require.Equal(t, 1, b.sim.BatchStats().Cancels, "nothing waits for the batch: canceled at the provider")
}
