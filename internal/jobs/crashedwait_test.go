package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestStore_WaitForCredential: a job whose attempt's delivery died (running, its lease run out)
// and that a later delivery finds on a credential that cannot take it (paused, its breaker open)
// shows it is waiting: it is retrying, with its next attempt's time, its lease given back, a
// last_error saying the attempt was lost and why it waits, and a retrying event; its dead
// attempt stays counted. Left running, it showed a call in flight that was not, for as long as
// the wait lasted, and counted in no waiting figure.
func TestStore_WaitForCredential(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	const reason = "credential paused: spend_cap"

	// crashed returns a job whose first attempt's lease has run out, as its attempt began.
	crashed := func(t *testing.T) (*jobstest.Bundle, *jobs.Job) {
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})
		started, err := b.Store.BeginAttempt(t.Context(), job.ID)
		require.NoError(t, err)
		b.ExpireLease(t, job.ID)
		return b, started
	}

	t.Run("LostAttemptRetrying", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b, job := crashed(t)

		require.NoError(t, b.Store.WaitForCredential(ctx, job.ID, job.CredentialIndex, at, reason))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusRetrying, got.Status)
		require.Equal(t, 1, got.Attempts, "the dead delivery's attempt stays counted")
		require.True(t, at.Equal(*got.NextAttemptAt))
		require.Nil(t, got.LeaseToken)
		require.Nil(t, got.LeaseUntil)
		require.Equal(t, string(retrypolicy.ClassCanceled), got.LastError.Class)
		require.Contains(t, got.LastError.Message, "attempt 1 ")
		require.Contains(t, got.LastError.Message, reason)
		require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusRunning, jobs.StatusRetrying}, b.Events(t, job.ID))

		// Waiting again only moves the time, and the next attempt is the second.
		later := at.Add(time.Minute)
		require.NoError(t, b.Store.WaitForCredential(ctx, job.ID, job.CredentialIndex, later, reason))
		got, err = b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.True(t, later.Equal(*got.NextAttemptAt))
		require.Len(t, b.Events(t, job.ID), 3)
		next, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, 2, next.Attempts)
	})

	t.Run("PostponeKeepsTheLostAttemptRunning", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b, job := crashed(t)
		// A wait for the job's turn on a credential that takes requests is short, and a job
		// still running is a re-attempt the retry budget does not charge (see decisions.md).
		require.NoError(t, b.Store.Postpone(ctx, job.ID, job.CredentialIndex, at))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusRunning, got.Status)
		require.True(t, at.Equal(*got.NextAttemptAt))
	})

	t.Run("LiveLeaseKeepsRunning", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})
		_, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		require.NoError(t, b.Store.WaitForCredential(ctx, job.ID, job.CredentialIndex, at, reason))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusRunning, got.Status)
		require.Nil(t, got.NextAttemptAt)
		require.NotNil(t, got.LeaseToken)
		require.Len(t, b.Events(t, job.ID), 2)
	})

	t.Run("WaitingJobOnlyPostponed", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})
		require.NoError(t, b.Store.WaitForCredential(ctx, job.ID, job.CredentialIndex, at, reason))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, got.Status)
		require.True(t, at.Equal(*got.NextAttemptAt))
		require.Nil(t, got.LastError)
		require.Equal(t, []jobs.Status{jobs.StatusQueued}, b.Events(t, job.ID))
	})

	t.Run("EndedJobUntouched", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b, job := crashed(t)
		_, err := b.Store.Cancel(ctx, job.ID)
		require.NoError(t, err)
		require.NoError(t, b.Store.WaitForCredential(ctx, job.ID, job.CredentialIndex, at, reason))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		require.Nil(t, got.NextAttemptAt)
	})

	t.Run("LateAnswerOfTheLostAttemptStored", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b, job := crashed(t)
		require.NoError(t, b.Store.WaitForCredential(ctx, job.ID, job.CredentialIndex, at, reason))

		// The attempt's delivery was only slow (Postgres out of its reach past its lease): its
		// answer, paid for, is stored when it records it, as when the job had stayed running.
		applied, err := b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default",
			StartedAt: time.Now(), Class: "ok", LeaseToken: *job.LeaseToken},
			jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"text":"late"}`)})
		require.NoError(t, err)
		require.True(t, applied)
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status)
		require.JSONEq(t, `{"text":"late"}`, string(got.Result))
		require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusRunning, jobs.StatusRetrying, jobs.StatusSucceeded},
			b.Events(t, job.ID))
	})
}
