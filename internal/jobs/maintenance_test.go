package jobs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

func TestStore_FailOverdue(t *testing.T) {
	t.Parallel()

	t.Run("FailsWaitingJobsOnly", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := t.Context()
		queued := b.Create(t, jobstest.Opts{})
		retrying := b.Create(t, jobstest.Opts{})
		b.Attempt(t, retrying.ID, jobs.Outcome{Status: jobs.StatusRetrying})
		orphaned := b.Create(t, jobstest.Opts{}) // running, its delivery died: lease ended
		_, err := b.Store.BeginAttempt(ctx, orphaned.ID)
		require.NoError(t, err)
		b.ExpireLease(t, orphaned.ID)
		leased := b.Create(t, jobstest.Opts{}) // running, its call in flight
		_, err = b.Store.BeginAttempt(ctx, leased.ID)
		require.NoError(t, err)
		done := b.Create(t, jobstest.Opts{})
		b.Attempt(t, done.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)})
		later := b.Create(t, jobstest.Opts{Timeout: time.Hour})

		// Given jobs with a one-minute timeout, two minutes on.
		got, err := b.Store.FailOverdue(ctx, time.Now().Add(2*time.Minute), 100)
		require.NoError(t, err)

		from := map[string]jobs.Status{}
		for _, o := range got {
			from[o.ID] = o.From
			require.Equal(t, "default", o.Credential)
			require.False(t, o.FinishedAt.Before(o.CreatedAt))
		}
		require.Equal(t, map[string]jobs.Status{queued.ID: jobs.StatusQueued, retrying.ID: jobs.StatusRetrying,
			orphaned.ID: jobs.StatusRunning}, from)
		for id, was := range from {
			job, err := b.Store.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusFailed, job.Status)
			require.Equal(t, jobs.ReasonDeadlineExceeded, job.LastError.Class)
			require.Contains(t, job.LastError.Message, string(was))
			require.NotNil(t, job.FinishedAt)
			require.Nil(t, job.NextAttemptAt)
			require.Nil(t, job.LeaseToken)
			evs, err := b.Store.Events(ctx, id, 0)
			require.NoError(t, err)
			last := evs[len(evs)-1]
			require.Equal(t, jobs.StatusFailed, last.Type)
			require.Equal(t, job.EventSeq, last.Seq)
			require.JSONEq(t, `{"from":"`+string(was)+`","reason":"deadline_exceeded"}`, string(last.Payload))
		}
		for id, want := range map[string]jobs.Status{leased.ID: jobs.StatusRunning, done.ID: jobs.StatusSucceeded, later.ID: jobs.StatusQueued} {
			job, err := b.Store.Get(ctx, id)
			require.NoError(t, err)
			require.Equal(t, want, job.Status)
		}

		// A second pass finds nothing more.
		got, err = b.Store.FailOverdue(ctx, time.Now().Add(2*time.Minute), 100)
		require.NoError(t, err)
		require.Empty(t, got)
	})

	t.Run("RacingDeliveryStoresNoSecondOutcome", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := t.Context()
		job := b.Create(t, jobstest.Opts{})
		_, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		b.ExpireLease(t, job.ID) // its delivery looks dead, but is only slow

		got, err := b.Store.FailOverdue(ctx, time.Now().Add(2*time.Minute), 100)
		require.NoError(t, err)
		require.Len(t, got, 1)

		// The slow delivery's answer arrives: its attempt is recorded, the outcome is not.
		applied, err := b.Store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(),
			StatusCode: 200, Class: "ok"}, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"x":1}`)})
		require.NoError(t, err)
		require.False(t, applied)
		stored, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusFailed, stored.Status)
		require.Nil(t, stored.Result)
		require.Equal(t, []jobs.Status{"queued", "running", "failed"}, b.Events(t, job.ID))
		// Nor can another delivery start an attempt.
		_, err = b.Store.BeginAttempt(ctx, job.ID)
		require.ErrorIs(t, err, jobs.ErrNotRunnable)
	})

	t.Run("BatchesOldestFirst", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := t.Context()
		var ids []string
		for _, timeout := range []time.Duration{3 * time.Minute, time.Minute, 2 * time.Minute} {
			ids = append(ids, b.Create(t, jobstest.Opts{Timeout: timeout}).ID)
		}
		now := time.Now().Add(5 * time.Minute)

		first, err := b.Store.FailOverdue(ctx, now, 2)
		require.NoError(t, err)
		require.Equal(t, []string{ids[1], ids[2]}, overdueIDs(first))
		second, err := b.Store.FailOverdue(ctx, now, 2)
		require.NoError(t, err)
		require.Equal(t, []string{ids[0]}, overdueIDs(second))
	})

	t.Run("SkipsARowLockedByADelivery", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := t.Context()
		busy := b.Create(t, jobstest.Opts{})
		free := b.Create(t, jobstest.Opts{})
		tx, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
		_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, busy.ID)
		require.NoError(t, err)

		// The locked job is passed over, not waited for.
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		got, err := b.Store.FailOverdue(wctx, time.Now().Add(2*time.Minute), 100)
		require.NoError(t, err)
		require.Equal(t, []string{free.ID}, overdueIDs(got))

		require.NoError(t, tx.Rollback(ctx))
		got, err = b.Store.FailOverdue(ctx, time.Now().Add(2*time.Minute), 100)
		require.NoError(t, err)
		require.Equal(t, []string{busy.ID}, overdueIDs(got))
	})
}

func overdueIDs(os []jobs.Overdue) []string {
	out := make([]string, len(os))
	for i, o := range os {
		out[i] = o.ID
	}
	return out
}

func TestStore_DeleteFinished(t *testing.T) {
	t.Parallel()

	for _, status := range []jobs.Status{jobs.StatusSucceeded, jobs.StatusFailed, jobs.StatusCanceled, jobs.StatusDead} {
		t.Run(string(status), func(t *testing.T) {
			t.Parallel()
			b := jobstest.New(t)
			ctx := t.Context()
			expired := b.Finished(t, status, "expired")
			b.FinishedAgo(t, expired, 10*24*time.Hour)
			recent := b.Finished(t, status, "recent")
			b.FinishedAgo(t, recent, 6*24*time.Hour)
			otherStatus := jobs.StatusSucceeded // another status is not this call's
			if status == jobs.StatusSucceeded {
				otherStatus = jobs.StatusFailed
			}
			other := b.Finished(t, otherStatus, "other-status")
			b.FinishedAgo(t, other, 10*24*time.Hour)
			waiting := b.Create(t, jobstest.Opts{})
			_, err := b.Pool.Exec(ctx, `UPDATE jobs SET created_at = now() - interval '30 days' WHERE id = $1`, waiting.ID)
			require.NoError(t, err)
			kept := map[string]map[string]int{}
			for _, id := range []string{recent, other, waiting.ID} {
				kept[id] = b.Rows(t, id)
			}
			require.Equal(t, map[string]int{"jobs": 1, "job_attempts": attemptsOf(status), "job_events": eventsOf(status),
				"job_watches": 1, "idempotency_keys": 1}, b.Rows(t, expired))

			n, err := b.Store.DeleteFinished(ctx, status, time.Now().Add(-7*24*time.Hour), 500)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)

			require.Equal(t, map[string]int{"jobs": 0, "job_attempts": 0, "job_events": 0, "job_watches": 0,
				"idempotency_keys": 0}, b.Rows(t, expired))
			for id, rows := range kept {
				require.Equal(t, rows, b.Rows(t, id), "job %s keeps its rows", id)
			}

			// The key of a deleted job promises nothing more: a resubmit with it makes a new job.
			again, replayed, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
				IdempotencyKey: "expired", Fingerprint: "fp-expired", Request: json.RawMessage(`{"model":"m"}`),
				MaxAttempts: 1, Timeout: time.Minute})
			require.NoError(t, err)
			require.False(t, replayed)
			require.NotEqual(t, expired, again.ID)
		})
	}

	t.Run("BoundedBatchesOldestFirst", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := t.Context()
		var ids []string
		for i, age := range []time.Duration{9, 11, 10} {
			id := b.Finished(t, jobs.StatusSucceeded, "k"+string(rune('a'+i)))
			b.FinishedAgo(t, id, age*24*time.Hour)
			ids = append(ids, id)
		}
		before := time.Now().Add(-7 * 24 * time.Hour)

		n, err := b.Store.DeleteFinished(ctx, jobs.StatusSucceeded, before, 2)
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		require.Equal(t, 1, b.Rows(t, ids[0])["jobs"], "the youngest is left for the next batch")
		n, err = b.Store.DeleteFinished(ctx, jobs.StatusSucceeded, before, 2)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		n, err = b.Store.DeleteFinished(ctx, jobs.StatusSucceeded, before, 2)
		require.NoError(t, err)
		require.Zero(t, n)
	})

	t.Run("NotAFinalStatus", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		_, err := b.Store.DeleteFinished(t.Context(), jobs.StatusQueued, time.Now(), 500)
		require.ErrorContains(t, err, `"queued" is not a final status`)
	})
}

// attemptsOf and eventsOf are how many attempts and events jobstest.Bundle.Finished makes for a job that
// ends in status.
func attemptsOf(status jobs.Status) int {
	if status == jobs.StatusCanceled {
		return 0
	}
	return 1
}

func eventsOf(status jobs.Status) int {
	if status == jobs.StatusCanceled {
		return 2
	}
	return 3
}

// TestStore_FailOverdueBatchJobNotSent: a batch-lane job its deadline fails while it waits for a
// batch shows batch_state not_sent (its deadline failed it before its batch was sent), as one
// failed in a committed batch does once the batch's send begins; it kept waiting for good.
func TestStore_FailOverdueBatchJobNotSent(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Minute, Lane: jobs.LaneBatch})
	require.NoError(t, err)
	require.Equal(t, "waiting", *job.BatchState)

	got, err := b.Store.FailOverdue(ctx, time.Now().Add(2*time.Minute), 100)
	require.NoError(t, err)
	require.Len(t, got, 1)
	job, err = b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusFailed, job.Status)
	require.NotNil(t, job.BatchState)
	require.Equal(t, "not_sent", *job.BatchState)
}
