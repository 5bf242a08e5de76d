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

	// The answer of an attempt the cancel overtook is not stored, but what the provider counted
	// for it is: on the attempt, and as the canceled job's usage, once.
	t.Run("AnswerAfterTheCancelKeepsItsUsage", func(t *testing.T) {
		t.Parallel()
		b := jobstest.New(t)
		ctx := context.Background()
		job := b.Create(t, jobstest.Opts{})
		begun, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		_, err = b.Store.Cancel(ctx, job.ID)
		require.NoError(t, err)
		a := &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(), Class: "ok", StatusCode: 200,
			LeaseToken: *begun.LeaseToken}
		usage := json.RawMessage(`{"input_tokens":7,"output_tokens":9}`)
		for range 2 { // the record runs again after a lost commit answer
			applied, err := b.Store.Finish(ctx, job.ID, a, jobs.Outcome{Status: jobs.StatusSucceeded,
				Result: json.RawMessage(`{"x":1}`), Usage: usage})
			require.NoError(t, err)
			require.False(t, applied)
		}
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		require.Nil(t, got.Result)
		require.JSONEq(t, string(usage), string(got.Usage))
		require.Equal(t, []jobs.Status{"queued", "running", "canceled"}, b.Events(t, job.ID))
		attempts, err := b.Store.Attempts(ctx, job.ID)
		require.NoError(t, err)
		require.Len(t, attempts, 1)
		require.JSONEq(t, string(usage), string(attempts[0].Usage))
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
		require.False(t, jobs.AlreadyCanceled(err))
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
		require.True(t, jobs.AlreadyCanceled(err))
		require.Equal(t, []jobs.Status{"queued", "canceled"}, b.Events(t, job.ID), "no event appended")
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

// TestStore_CancelADeadJob: a dead job the client no longer wants is canceled (its dead reason
// kept in the event's payload): it is no dead letter any more, so an operator's retry of every
// dead letter (after an outage) does not send it again and pay for it. Cancel answered it
// *TerminalError (the API's 409 job_terminal), and the retry sent it.
func TestStore_CancelADeadJob(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()
	dead := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	other := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)

	got, err := b.Store.Cancel(ctx, dead.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Nil(t, got.DeadReason)
	require.Equal(t, []jobs.Status{"queued", "running", "dead", "canceled"}, b.Events(t, dead.ID))
	evs, err := b.Store.Events(ctx, dead.ID, 3)
	require.NoError(t, err)
	require.JSONEq(t, `{"from":"dead","previous_reason":"retries_exhausted"}`, string(evs[0].Payload))
	_, err = b.Store.Cancel(ctx, dead.ID)
	require.True(t, jobs.AlreadyCanceled(err), "a second cancel changes nothing: %v", err)

	list, err := b.Store.PageDead(ctx, jobs.DeadFilter{}, "")
	require.NoError(t, err)
	require.Len(t, list.Jobs, 1)
	require.Equal(t, other.ID, list.Jobs[0].ID, "no dead letter any more")
	retried, err := b.Store.RetryDead(ctx, jobs.DeadFilter{}, nil)
	require.NoError(t, err)
	require.Equal(t, []jobs.Unfinished{{ID: other.ID, Status: jobs.StatusQueued, Priority: jobs.PriorityNormal}}, retried)
	got, err = b.Store.Get(ctx, dead.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status, "a retry of every dead letter leaves it canceled")
}

// CancelOf cancels its tenant's job alone: another tenant's is ErrNotFound, exactly like a
// missing one, untouched, and its row lock is not waited for (the API cancels through it without
// reading the job first: a tenant's cancels of ids it does not own wait on no one's row).
func TestStore_CancelOf(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job := b.Create(t, jobstest.Opts{Tenant: "a"})

	// The row locked, as a worker's transition or another cancel holds it.
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
	require.NoError(t, err)
	_, err = b.Store.CancelOf(ctx, "b", job.ID)
	require.ErrorIs(t, err, jobs.ErrNotFound)
	require.NoError(t, tx.Rollback(ctx))

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status, "another tenant's cancel ended the job")
	got, err = b.Store.CancelOf(ctx, "a", job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	_, err = b.Store.CancelOf(ctx, "a", job.ID)
	require.True(t, jobs.AlreadyCanceled(err), "%v", err)
}
