package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_DeferralOfALeftCredentialWritesNothing: two deliveries of one job race. Both read it
// on its own credential; one finds that credential paused and fails the job over to its fallback
// (NextCredential, which clears the job's next attempt time: the fallback takes it now), then
// the other, which waits for the credential rather than failing over (its config does not know
// it, a pause it read before the move), writes its deferral. That deferral is of a credential
// the job has left: it writes nothing, neither the recheck time (which held the job back on its
// fallback for the left credential's recheck) nor, for a lost attempt, a move to retrying. The
// delivery ends as a stale one does: it comes back at its own time, and finds the job moved.
func TestStore_DeferralOfALeftCredentialWritesNothing(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(time.Minute).Truncate(time.Millisecond)
	const reason = "credential paused: manual"

	// race returns a job read by a stale delivery (at index 0) after another delivery has moved
	// it to its first fallback; lost: its first attempt began and its lease has run out.
	race := func(t *testing.T, lost bool) (*jobstest.Bundle, *jobs.Job) {
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{Fallbacks: []string{"backup"}})
		if lost {
			_, err := b.Store.BeginAttempt(t.Context(), job.ID)
			require.NoError(t, err)
			b.ExpireLease(t, job.ID)
		}
		stale, err := b.Store.Get(t.Context(), job.ID)
		require.NoError(t, err)
		moved, err := b.Store.NextCredential(t.Context(), job.ID, stale.CredentialIndex)
		require.NoError(t, err)
		require.True(t, moved)
		return b, stale
	}
	// unchanged asserts the job is as the move left it: on its fallback, due now.
	unchanged := func(t *testing.T, b *jobstest.Bundle, id string, status jobs.Status) {
		got, err := b.Store.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, "backup", got.CurrentCredential())
		require.Nil(t, got.NextAttemptAt, "the fallback takes the job now, not at the left credential's recheck")
		require.Equal(t, status, got.Status)
	}

	t.Run("WaitForCredential", func(t *testing.T) {
		t.Parallel()
		b, stale := race(t, false)
		require.NoError(t, b.Store.WaitForCredential(t.Context(), stale.ID, stale.CredentialIndex, at, reason))
		unchanged(t, b, stale.ID, jobs.StatusQueued)
	})

	t.Run("WaitForCredentialLostAttempt", func(t *testing.T) {
		t.Parallel()
		b, stale := race(t, true)
		require.NoError(t, b.Store.WaitForCredential(t.Context(), stale.ID, stale.CredentialIndex, at, reason))
		unchanged(t, b, stale.ID, jobs.StatusRunning)
		require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusRunning}, b.Events(t, stale.ID))
	})

	t.Run("Postpone", func(t *testing.T) {
		t.Parallel()
		b, stale := race(t, false)
		require.NoError(t, b.Store.Postpone(t.Context(), stale.ID, stale.CredentialIndex, at))
		unchanged(t, b, stale.ID, jobs.StatusQueued)
	})

	t.Run("CurrentCredentialWrites", func(t *testing.T) {
		t.Parallel()
		b, stale := race(t, false)
		require.NoError(t, b.Store.WaitForCredential(t.Context(), stale.ID, stale.CredentialIndex+1, at, reason))
		got, err := b.Store.Get(t.Context(), stale.ID)
		require.NoError(t, err)
		require.True(t, at.Equal(*got.NextAttemptAt))
	})
}
