package jobs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

func TestStore_Cancel(t *testing.T) {
	t.Parallel()

	t.Run("Queued", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})

		got, err := b.Store.Cancel(context.Background(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		require.NotNil(t, got.FinishedAt)
		require.Equal(t, 2, got.EventSeq)
		require.Equal(t, []jobs.Status{"queued", "canceled"}, b.Events(t, job.ID))
		evs, err := b.Store.Events(context.Background(), job.ID, 1)
		require.NoError(t, err)
		require.JSONEq(t, `{"from":"queued"}`, string(evs[0].Payload))

		// The worker can no longer start it.
		_, err = b.Store.BeginAttempt(context.Background(), job.ID)
		require.ErrorIs(t, err, jobs.ErrNotRunnable)
	})

	t.Run("RunningStoresNoResult", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := context.Background()
		job := b.Create(t, jobstest.Opts{})
		_, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)

		_, err = b.Store.Cancel(ctx, job.ID)
		require.NoError(t, err)
		// The attempt in flight ends and tries to store its result: refused.
		applied, err := b.Store.Finish(ctx, job.ID, nil, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"x":1}`)})
		require.NoError(t, err)
		require.False(t, applied)
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		require.Nil(t, got.Result)
		require.Equal(t, []jobs.Status{"queued", "running", "canceled"}, b.Events(t, job.ID))
	})

	t.Run("Retrying", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})
		b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})

		got, err := b.Store.Cancel(context.Background(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		require.Nil(t, got.NextAttemptAt)
	})

	t.Run("TerminalIsTerminalError", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})
		b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)})

		_, err := b.Store.Cancel(context.Background(), job.ID)
		var te *jobs.TerminalError
		require.ErrorAs(t, err, &te)
		require.Equal(t, jobs.StatusSucceeded, te.Status)
		require.EqualError(t, err, "job is succeeded")
		require.Len(t, b.Events(t, job.ID), 3, "no event appended")
	})

	t.Run("TwiceIsTerminalError", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})
		_, err := b.Store.Cancel(context.Background(), job.ID)
		require.NoError(t, err)
		_, err = b.Store.Cancel(context.Background(), job.ID)
		require.EqualError(t, err, "job is canceled")
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		for _, id := range []string{"0190a5b2-7c1e-7d3f-9a8b-123456789abc", "not-a-uuid"} {
			_, err := b.Store.Cancel(context.Background(), id)
			require.ErrorIs(t, err, jobs.ErrNotFound)
		}
	})
}
