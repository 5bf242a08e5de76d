package api

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

func TestCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	t.Run("QueuedJobAndItsTask", func(t *testing.T) {
		t.Parallel()
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, nil)
		require.Equal(t, http.StatusAccepted, r.status)
		id := r.body["id"].(string)
		info, err := b.inspector.GetTaskInfo(b.queue, id)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStatePending, info.State)

		r = b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)
		require.Equal(t, http.StatusOK, r.status, "body %v", r.body)
		require.Equal(t, "canceled", r.body["status"])
		require.Nil(t, r.body["result"])
		require.NotNil(t, r.body["finished_at"])
		_, err = b.inspector.GetTaskInfo(b.queue, id)
		require.ErrorIs(t, err, asynq.ErrTaskNotFound, "the waiting task is gone: no worker will pick it up")
		require.Equal(t, "canceled", b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil).body["status"])
	})

	// A job whose row holds a limiter slot (waiting for its send time) has its task run at
	// once rather than deleted: that delivery gives the slot's tokens back (see executor).
	t.Run("JobHoldingASlotHasItsTaskRun", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		job := b.create(t, "")
		held, err := b.store.HoldSlot(ctx, job.ID, time.Now().Add(time.Hour), 7, 3)
		require.NoError(t, err)
		require.True(t, held)
		require.NoError(t, b.srv.cfg.Enqueuer.Enqueue(ctx, job.ID, "", time.Now().Add(time.Hour)))
		info, err := b.inspector.GetTaskInfo(b.queue, job.ID)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStateScheduled, info.State)

		require.Equal(t, http.StatusOK, b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil).status)
		info, err = b.inspector.GetTaskInfo(b.queue, job.ID)
		require.NoError(t, err, "the task of a job holding a slot was deleted: nothing gives the slot back")
		require.Equal(t, asynq.TaskStatePending, info.State)
	})

	t.Run("RunningJob", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		_, err := b.store.BeginAttempt(context.Background(), job.ID)
		require.NoError(t, err)
		r := b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "canceled", r.body["status"])
	})

	t.Run("TerminalIs409", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
		r := b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
		require.Equal(t, http.StatusConflict, r.status)
		require.Equal(t, map[string]any{"error": map[string]any{"type": "job_terminal", "message": "job is succeeded"}}, r.body)
	})

	// A client whose cancel's answer was lost sends the DELETE again: it learns that its cancel
	// took (200 and the canceled job, as the first answer), not 409 for its own cancel; nothing
	// changes. It answered 409 job_terminal "job is canceled".
	t.Run("TwiceAnswersTheCanceledJob", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		first := b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
		require.Equal(t, http.StatusOK, first.status)
		r := b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
		require.Equal(t, http.StatusOK, r.status, "body %v", r.body)
		require.Equal(t, first.body, r.body, "the same canceled job")
		got, err := b.store.Get(context.Background(), job.ID)
		require.NoError(t, err)
		require.Equal(t, 2, got.EventSeq, "no event appended")
	})

	// A cancel whose commit's answer was lost (or whose abort Redis refused) left the job's task
	// in Redis: the job is canceled, and a worker's attempt goes on until its lease's next
	// renewal. The client sends the DELETE again: 200, and now the task is aborted. It answered
	// 200 and left the task as it was (nothing to abort, "that cancel did").
	t.Run("ResentAbortsTheTaskTheFirstLeft", func(t *testing.T) {
		t.Parallel()
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, nil)
		require.Equal(t, http.StatusAccepted, r.status)
		id := r.body["id"].(string)
		_, err := b.store.Cancel(context.Background(), id) // the first cancel: committed, no abort
		require.NoError(t, err)
		_, err = b.inspector.GetTaskInfo(b.queue, id)
		require.NoError(t, err, "the first cancel's abort never ran")

		r = b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)
		require.Equal(t, http.StatusOK, r.status, "body %v", r.body)
		require.Equal(t, "canceled", r.body["status"])
		_, err = b.inspector.GetTaskInfo(b.queue, id)
		require.ErrorIs(t, err, asynq.ErrTaskNotFound, "the resent cancel aborted the task")
	})

	// A dead job the client no longer wants: canceled (200), so that an operator's retry of
	// the dead letters does not send it again. It answered 409 job_terminal "job is dead".
	t.Run("DeadJobIsCanceled", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
		r := b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
		require.Equal(t, http.StatusOK, r.status, "body %v", r.body)
		require.Equal(t, "canceled", r.body["status"])
		dead, err := b.store.PageDead(context.Background(), jobs.DeadFilter{IDs: []string{job.ID}}, "")
		require.NoError(t, err)
		require.Empty(t, dead.Jobs, "no dead letter any more")
	})

	t.Run("NotFound", func(t *testing.T) {
		t.Parallel()
		other := b.create(t, "someone-else")
		for _, id := range []string{"0190a5b2-7c1e-7d3f-9a8b-123456789abc", "nope", other.ID} {
			r := b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)
			require.Equal(t, http.StatusNotFound, r.status)
		}
		got, err := b.store.Get(context.Background(), other.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, got.Status, "another tenant's job is untouched")
	})

	t.Run("StreamSeesCancel", func(t *testing.T) {
		t.Parallel()
		job := b.create(t, "")
		s := openStream(t, b.url, job.ID, "")
		require.Equal(t, "queued", s.nextEvent(t).event)
		require.Equal(t, http.StatusOK, b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil).status)
		require.Equal(t, []string{"canceled/2"}, names(s.rest(t)))
	})
}
