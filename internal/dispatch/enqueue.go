package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/jobs"
)

// TaskType is the asynq task type of one job attempt. The task's ID is the job's ID.
const TaskType = "llmq:attempt"

// taskTimeout bounds one delivery: the longest inline wait plus the longest attempt.
const taskTimeout = time.Hour

// taskMaxRetry is effectively unlimited: llmq counts attempts in Postgres, and asynq retries are
// only deferrals (not failures, see IsFailure) or infrastructure errors.
const taskMaxRetry = 1 << 20

// objectPayload is the body of a due task (see Mux), and of a task enqueued before bodies were
// the bare job ID (see jobIDOf).
type objectPayload struct {
	JobID string `json:"job_id"`
	// Deferred is why a due task's job waits (the executor's reason for the deferral): asynq
	// keeps no error for a task that never ran, and an operator inspecting the due queue sees it
	// here.
	Deferred string `json:"deferred,omitempty"`
}

// jobIDOf returns the job a task's body names: the body is the job ID itself, or, for a due task
// or a task enqueued by an earlier version, {"job_id": ...}. The bare ID saves a JSON encode and
// decode per delivery (half of the worker's JSON time in its profile).
func jobIDOf(payload []byte) (string, error) {
	if len(payload) == 0 || payload[0] != '{' {
		return string(payload), nil
	}
	var p objectPayload
	if err := json.Unmarshal(payload, &p); err != nil {
		return "", err
	}
	return p.JobID, nil
}

// Enqueuer hands jobs to asynq, each on its priority's queue (see Queues), and wakes an idle
// worker for a task due now (see wake.go). It is safe for concurrent use.
type Enqueuer struct {
	client *asynq.Client
	queues Queues
	wake   redis.Cmdable
}

// NewEnqueuer returns an Enqueuer on the llmq queue named queue using client, and wakeRedis (the
// same Redis) for the wake-ups; nil wakeRedis: the workers find its tasks at their next poll.
// Neither is closed by the Enqueuer.
func NewEnqueuer(client *asynq.Client, queue string, wakeRedis redis.Cmdable) *Enqueuer {
	return &Enqueuer{client: client, queues: NewQueues(queue), wake: wakeRedis}
}

// Enqueue schedules the task of the job, whose priority is p, for at (now if zero or past).
// Enqueueing a job whose task already exists is a no-op, which is what makes the API's enqueue
// and the sweeper's safe to race.
func (e *Enqueuer) Enqueue(ctx context.Context, jobID string, p jobs.Priority, at time.Time) error {
	return e.enqueue(ctx, []byte(jobID), jobID, e.queues.For(p), at)
}

// EnqueueRescue enqueues a second task for the job, under its own TaskID (the job ID +
// ":rescue"), for when the job's task is stuck active on a dead worker. It is a no-op while a
// rescue task exists. The stuck task, once asynq recovers it, finds the job finished or leased.
func (e *Enqueuer) EnqueueRescue(ctx context.Context, jobID string, p jobs.Priority) error {
	return e.enqueueRescue(ctx, jobID, e.queues.For(p))
}

// enqueueRescue enqueues the job's rescue task on queue: its priority's, or the main queue for
// a low job whose due task is the stuck one (see Sweeper.rescueOrphans).
func (e *Enqueuer) enqueueRescue(ctx context.Context, jobID, queue string) error {
	return e.enqueue(ctx, []byte(jobID), jobID+rescueSuffix, queue, time.Time{})
}

// rescueSuffix ends the TaskID of a rescue task (see Enqueuer.EnqueueRescue).
const rescueSuffix = ":rescue"

// enqueueDue schedules a delivery of the job for at on the main queue (Queues.Due), under its own
// TaskID (the job ID + ":due"; see Mux), its body naming why the job waits. It is a no-op while a
// due task for the job exists.
func (e *Enqueuer) enqueueDue(ctx context.Context, jobID string, at time.Time, reason string) error {
	body, err := json.Marshal(objectPayload{JobID: jobID, Deferred: reason})
	if err != nil {
		return fmt.Errorf("encode due task of job %s: %w", jobID, err)
	}
	return e.enqueue(ctx, body, jobID+dueSuffix, e.queues.Due(), at)
}

// dueSuffix ends the TaskID of a due task (see Enqueuer.enqueueDue).
const dueSuffix = ":due"

func (e *Enqueuer) enqueue(ctx context.Context, body []byte, taskID, queue string, at time.Time) error {
	opts := []asynq.Option{asynq.TaskID(taskID), asynq.Queue(queue), asynq.MaxRetry(taskMaxRetry), asynq.Timeout(taskTimeout)}
	later := !at.IsZero() && time.Until(at) > 0
	if later {
		opts = append(opts, asynq.ProcessAt(at))
	}
	_, err := e.client.EnqueueContext(ctx, asynq.NewTask(TaskType, body), opts...)
	switch {
	case errors.Is(err, asynq.ErrTaskIDConflict):
		return nil // the task exists: whoever enqueued it woke a worker
	case err != nil:
		return fmt.Errorf("enqueue task %s: %w", taskID, err)
	}
	if !later && e.wake != nil {
		wake(ctx, e.wake, e.queues.base, queue)
	}
	return nil
}
