package jobs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

func TestStore_AttemptLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OneCallInFlight", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})
		first, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		require.NotNil(t, first.LeaseToken)
		require.True(t, first.Leased(time.Now()))
		require.WithinDuration(t, time.Now().Add(jobs.AttemptLease), *first.LeaseUntil, 5*time.Second)

		// A duplicate delivery cannot begin a second call while the first holds the lease.
		_, err = b.Store.BeginAttempt(ctx, job.ID)
		var leased *jobs.LeasedError
		require.ErrorAs(t, err, &leased)
		require.True(t, leased.Until.Equal(*first.LeaseUntil))
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, 1, got.Attempts, "the refused delivery counted no attempt")

		// Renewing moves the end; Finish with the attempt's token releases it.
		ok, err := b.Store.RenewLease(ctx, job.ID, *first.LeaseToken)
		require.NoError(t, err)
		require.True(t, ok)
		next := time.Now().Add(time.Second)
		applied, err := b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(),
			Class: "server_error", StatusCode: 503, LeaseToken: *first.LeaseToken},
			jobs.Outcome{Status: jobs.StatusRetrying, NextAttemptAt: &next, LastError: &jobs.LastError{Class: "server_error", Message: "x"}})
		require.NoError(t, err)
		require.True(t, applied)
		got, err = b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Nil(t, got.LeaseToken)
		require.Nil(t, got.LeaseUntil)
		ok, err = b.Store.RenewLease(ctx, job.ID, *first.LeaseToken)
		require.NoError(t, err)
		require.False(t, ok, "a released lease cannot be renewed")

		second, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, 2, second.Attempts)
	})

	// takenOver is a job whose first delivery's lease ran out and a second delivery took it.
	takenOver := func(t *testing.T) (b *jobstest.Bundle, job, dead, taker *jobs.Job) {
		b = jobstest.New(t)
		job = b.Create(t, jobstest.Opts{})
		dead, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		b.ExpireLease(t, job.ID)
		taker, err = b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		return b, job, dead, taker
	}

	t.Run("DeadDeliveryTakenOver", func(t *testing.T) {
		t.Parallel()
		b, job, dead, taker := takenOver(t)
		require.NotEqual(t, *dead.LeaseToken, *taker.LeaseToken)
		require.Equal(t, 2, taker.Attempts)

		// The old delivery, if it was only slow, can neither renew nor release the new lease.
		ok, err := b.Store.RenewLease(ctx, job.ID, *dead.LeaseToken)
		require.NoError(t, err)
		require.False(t, ok)
		next := time.Now()
		_, err = b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(),
			Class: "timeout", LeaseToken: *dead.LeaseToken},
			jobs.Outcome{Status: jobs.StatusRetrying, NextAttemptAt: &next, LastError: &jobs.LastError{Class: "timeout", Message: "x"}})
		require.NoError(t, err)
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, taker.LeaseToken, got.LeaseToken)
		// Nor move the job out from under the taker's call: a job back in retrying would let a
		// third delivery start a call beside it.
		require.Equal(t, jobs.StatusRunning, got.Status)
		_, err = b.Store.BeginAttempt(ctx, job.ID)
		var leased *jobs.LeasedError
		require.ErrorAs(t, err, &leased, "the taker's live lease keeps a third call out")
	})

	t.Run("DeadDeliveryAnswerStored", func(t *testing.T) {
		t.Parallel()
		b, job, dead, taker := takenOver(t)

		// An answer the old delivery got is stored all the same: it was paid for, and the
		// taker's, when it comes, finds the job ended.
		applied, err := b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(),
			Class: "ok", StatusCode: 200, LeaseToken: *dead.LeaseToken},
			jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"late":true}`)})
		require.NoError(t, err)
		require.True(t, applied)
		applied, err = b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: 2, Credential: "default", StartedAt: time.Now(),
			Class: "ok", StatusCode: 200, LeaseToken: *taker.LeaseToken},
			jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{"taker":true}`)})
		require.NoError(t, err)
		require.False(t, applied, "one result")
	})

	t.Run("TerminalIsNotRunnable", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		job := b.Create(t, jobstest.Opts{})
		b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
		_, err := b.Store.BeginAttempt(ctx, job.ID)
		require.ErrorIs(t, err, jobs.ErrNotRunnable)
	})
}

// TestStore_CrashedJobWaits checks that a job whose attempt's delivery died (running, lease
// ended) can hold a limiter slot and be postponed like a queued one, while a live attempt's job
// cannot.
func TestStore_CrashedJobWaits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	job := b.Create(t, jobstest.Opts{})
	_, err := b.Store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	at := time.Now().Add(time.Minute).Truncate(time.Millisecond)

	held, err := b.Store.HoldSlot(ctx, job.ID, at, 7, 3)
	require.NoError(t, err)
	require.False(t, held)
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Nil(t, got.SlotSeq, "a live attempt's job is not waiting")

	b.ExpireLease(t, job.ID)
	held, err = b.Store.HoldSlot(ctx, job.ID, at, 7, 3)
	require.NoError(t, err)
	require.True(t, held)
	got, err = b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, int64(7), *got.SlotSeq)
	require.Equal(t, int64(3), *got.SlotGrant)
	require.True(t, at.Equal(*got.NextAttemptAt))

	later := at.Add(time.Minute)
	require.NoError(t, b.Store.Postpone(ctx, job.ID, job.CredentialIndex, later))
	got, err = b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.True(t, later.Equal(*got.NextAttemptAt))
}

// An ended job's held slot is taken from its row once: only the caller that takes it gives it
// back. A job still waiting keeps its slot, and a slot of another sequence is not this one.
func TestStore_TakeEndedSlot(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	job := b.Create(t, jobstest.Opts{})
	held, err := b.Store.HoldSlot(ctx, job.ID, time.Now().Add(time.Minute), 7, 3)
	require.NoError(t, err)
	require.True(t, held)

	took, err := b.Store.TakeEndedSlot(ctx, job.ID, 7)
	require.NoError(t, err)
	require.False(t, took, "a waiting job's slot is its own")

	_, err = b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)
	took, err = b.Store.TakeEndedSlot(ctx, job.ID, 8)
	require.NoError(t, err)
	require.False(t, took, "another slot")
	took, err = b.Store.TakeEndedSlot(ctx, job.ID, 7)
	require.NoError(t, err)
	require.True(t, took)
	took, err = b.Store.TakeEndedSlot(ctx, job.ID, 7)
	require.NoError(t, err)
	require.False(t, took, "taken twice")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Nil(t, got.SlotSeq)
	require.Nil(t, got.SlotGrant)
}

// A dead job retried keeps no limiter slot from its last round: a duplicate delivery held one
// in its row after the dying attempt's lease had run out. Kept with no next attempt time, the
// retried job's first delivery sent on it at once, unpaced.
func TestStore_RetryDeadDropsAHeldSlot(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	job := b.Create(t, jobstest.Opts{})
	begun, err := b.Store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	b.ExpireLease(t, job.ID)
	held, err := b.Store.HoldSlot(ctx, job.ID, time.Now().Add(time.Minute), 7, 3)
	require.NoError(t, err)
	require.True(t, held)
	applied, err := b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(),
		Class: "rate_limited", LeaseToken: *begun.LeaseToken},
		jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
	require.NoError(t, err)
	require.True(t, applied)

	_, err = b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: []string{job.ID}}, nil)
	require.NoError(t, err)
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)
	require.Nil(t, got.SlotSeq, "the retried job holds its last round's slot")
}
