package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/jobs"
)

// Tasks acts on the asynq side of jobs: aborting the attempt of a canceled job, putting a job
// back on the queue for an operator, and reading the queue's depth. Postgres stays the source of
// truth; Tasks only keeps Redis in step with it. Safe for concurrent use.
type Tasks struct {
	inspector *asynq.Inspector
	enqueuer  *Enqueuer
}

// NewTasks returns Tasks for the enqueuer's queue. The inspector and the enqueuer's client are
// not closed by Tasks.
func NewTasks(inspector *asynq.Inspector, enqueuer *Enqueuer) *Tasks {
	return &Tasks{inspector: inspector, enqueuer: enqueuer}
}

// Abort stops the job's task: it signals every worker process to cancel the task's context if it is
// running it (asynq's cancelation channel, so it reaches whichever process holds the task; the
// provider call's context ends with it), and deletes the task when it is waiting (pending,
// scheduled or retry) on any of its queues, so a canceled job is not even picked up. The job's due
// task (see Mux) and its rescue task (see Enqueuer.EnqueueRescue) are stopped the same way. Best
// effort: a task that starts between the two steps is skipped by the executor, which finds the job
// terminal. The error reports a step that Redis refused; the cancellation in Postgres stands either
// way.
func (t *Tasks) Abort(id string) error {
	var errs []error
	if err := t.signal(id); err != nil {
		errs = append(errs, err)
	}
	if _, err := t.deleteWaiting(id); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// AbortHeld is Abort for a job that ended while its row still held a limiter slot
// (jobs.Job.SlotSeq: canceled, or failed by its deadline, while it waited for the slot's time):
// one waiting task of the job is run at once instead of deleted, so that a worker's delivery
// finds the job ended and gives the slot's tokens (and a pause probe held with it) back now,
// rather than never (see executor); the job's other waiting tasks are deleted, and a running
// one is signaled, as by Abort. When no task waits (a running delivery's, say, comes back as
// asynq's retry), a later delivery gives the slot back. Best effort, as Abort is.
func (t *Tasks) AbortHeld(id string) error {
	var errs []error
	if err := t.signal(id); err != nil {
		errs = append(errs, err)
	}
	run := false
	for _, task := range t.enqueuer.queues.tasksOf(id) {
		info, err := t.inspector.GetTaskInfo(task.queue, task.id)
		if taskAbsent(err) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("look up task %s: %w", task.id, err))
			continue
		}
		switch {
		case info.State == asynq.TaskStateActive:
			continue
		case info.State == asynq.TaskStatePending && !run:
			run = true // it runs soon
			continue
		case (info.State == asynq.TaskStateScheduled || info.State == asynq.TaskStateRetry) && !run:
			err := t.inspector.RunTask(task.queue, task.id)
			switch {
			case err == nil:
				run = true
			case !taskAbsent(err):
				errs = append(errs, fmt.Errorf("run task %s: %w", task.id, err))
			}
			continue
		}
		if err := t.inspector.DeleteTask(task.queue, task.id); err != nil && !taskAbsent(err) {
			errs = append(errs, fmt.Errorf("delete task %s: %w", task.id, err))
		}
	}
	return errors.Join(errs...)
}

// signal signals every worker process to cancel the job's running task, on each of its queues
// (see Abort).
func (t *Tasks) signal(id string) error {
	var errs []error
	for _, task := range t.enqueuer.queues.tasksOf(id) {
		if task.queue == t.enqueuer.queues.For(jobs.PriorityLow) {
			continue // the same task ID as on the main queue: one signal reaches either
		}
		if err := t.inspector.CancelProcessing(task.id); err != nil {
			errs = append(errs, fmt.Errorf("signal cancelation of task %s: %w", task.id, err))
		}
	}
	return errors.Join(errs...)
}

// AbortEnded stops the task of job, which ended (the job a cancel returned): AbortHeld when
// its row still holds a limiter slot, else Abort.
func (t *Tasks) AbortEnded(job *jobs.Job) error {
	if job.SlotSeq != nil {
		return t.AbortHeld(job.ID)
	}
	return t.Abort(job.ID)
}

// Requeue puts the task of the job, whose priority is p, back on the queue to run now. A
// waiting, completed or archived task of the job is deleted first, from every queue, because
// asynq rejects a second task with the same ID while the first exists (Enqueue would silently
// do nothing); an active one is left alone. When the task Requeue would enqueue is active (the
// delivery that dead-lettered the job has not returned yet, or one that found it dead), a
// rescue task (see Enqueuer.EnqueueRescue) is enqueued instead: the active one ends without
// running the job, and the job would have had no task until a sweep found it. When Requeue
// fails after the job was set queued in Postgres, the sweeper enqueues it later.
func (t *Tasks) Requeue(ctx context.Context, id string, p jobs.Priority) error {
	active, err := t.deleteWaiting(id)
	if err != nil {
		return err
	}
	if slices.Contains(active, placedTask{t.enqueuer.queues.For(p), id}) {
		return t.enqueuer.EnqueueRescue(ctx, id, p)
	}
	return t.enqueuer.Enqueue(ctx, id, p, time.Time{})
}

// deleteWaiting deletes the job's tasks from each queue that holds one, unless it is active, and
// returns the active ones it left.
func (t *Tasks) deleteWaiting(id string) ([]placedTask, error) {
	var active []placedTask
	for _, task := range t.enqueuer.queues.tasksOf(id) {
		info, err := t.inspector.GetTaskInfo(task.queue, task.id)
		if taskAbsent(err) {
			continue
		}
		if err != nil {
			return active, fmt.Errorf("look up task %s: %w", task.id, err)
		}
		if info.State == asynq.TaskStateActive {
			active = append(active, task)
			continue
		}
		if err := t.inspector.DeleteTask(task.queue, task.id); err != nil && !taskAbsent(err) {
			return active, fmt.Errorf("delete task %s: %w", task.id, err)
		}
	}
	return active, nil
}

func taskAbsent(err error) bool {
	return errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound)
}

// QueueDepth counts the tasks of the queue by state.
type QueueDepth struct {
	Pending   int `json:"pending"`
	Active    int `json:"active"`
	Scheduled int `json:"scheduled"`
	Retry     int `json:"retry"`
	Archived  int `json:"archived"`
}

// Depth returns the task counts of the llmq queue, summed over its asynq queues; a
// queue that never held a task counts zero.
func (t *Tasks) Depth() (QueueDepth, error) {
	// GetQueueInfo's not-found error is asynq-internal (no sentinel matches it): ask first.
	queues, err := t.inspector.Queues()
	if err != nil {
		return QueueDepth{}, fmt.Errorf("list queues: %w", err)
	}
	var d QueueDepth
	for _, queue := range t.enqueuer.queues.All() {
		if !slices.Contains(queues, queue) {
			continue
		}
		info, err := t.inspector.GetQueueInfo(queue)
		if err != nil {
			return QueueDepth{}, fmt.Errorf("read queue %s: %w", queue, err)
		}
		d.Pending += info.Pending
		d.Active += info.Active
		d.Scheduled += info.Scheduled
		d.Retry += info.Retry
		d.Archived += info.Archived
	}
	return d, nil
}
