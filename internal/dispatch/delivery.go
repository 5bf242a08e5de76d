package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/gostack"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// Delivery is one hand-over of a job's task to a worker. asynq delivers at least once: the same
// job may be delivered again, and twice at once.
type Delivery struct {
	// JobID is the job the task is for.
	JobID string
	// Retried is how many times asynq handed this task back after a delivery returned an error
	// (a deferral or a failure of the stores); 0 on its first delivery.
	Retried int
	// Low is set when the task is a low job's: it came from the low jobs' queue, or it is the
	// due task of a low job's deferred delivery (see Enqueuer.enqueueDue). The rescue of a low
	// job's stuck due task, on the main queue (see Sweeper.rescueOrphans), is not: one delivery.
	Low bool
}

// Processor runs one delivery of a job: nil when the job needs nothing more from it, a
// *DeferError when it must come back later, another error when the stores failed (the delivery
// is retried with backoff). Implementations must be safe for concurrent use.
type Processor interface {
	Process(ctx context.Context, d Delivery) error
}

// DeferError asks for the task to be delivered again at Until without counting a failure.
type DeferError struct {
	Until  time.Time
	Reason string
}

func (e *DeferError) Error() string {
	return fmt.Sprintf("deferred until %s: %s", e.Until.Format(time.RFC3339Nano), e.Reason)
}

// IsFailure tells asynq which errors count as failures: deferrals do not.
func IsFailure(err error) bool {
	var d *DeferError
	return !errors.As(err, &d)
}

// RetryDelayFunc returns asynq's RetryDelayFunc: deferrals come back at their time (asynq keeps
// whole seconds, so up to a second early, and the processor waits out the rest); a task whose
// worker died (asynq.ErrLeaseExpired) comes back at once (the attempt lease in Postgres keeps a
// live call from being doubled); any other error (Postgres unreachable, say) backs off with full
// jitter over at most maxStoreRetryStep doublings of the policy's base delay. asynq's n counts
// every deferral too, so it says nothing about how long the stores have been failing: without
// the cap, a job deferred a few times waited minutes after a worker crash or a Postgres blip.
func RetryDelayFunc(policy *retrypolicy.Policy, now func() time.Time) asynq.RetryDelayFunc {
	return func(n int, err error, _ *asynq.Task) time.Duration {
		var d *DeferError
		switch {
		case errors.As(err, &d):
			return max(0, d.Until.Sub(now()))
		case errors.Is(err, asynq.ErrLeaseExpired):
			return 0
		}
		return policy.Delay(min(n+1, maxStoreRetryStep), retrypolicy.Decision{Class: retrypolicy.ClassNetwork, Retry: true})
	}
}

// maxStoreRetryStep caps the backoff step of a delivery that failed on the stores.
const maxStoreRetryStep = 3

// handler adapts a Processor to asynq.
type handler struct {
	p   Processor
	due *Enqueuer
}

// ProcessTask implements asynq.Handler. A deferral of a task on the low queue becomes a due task
// on the main queue for the deferral's time (see Mux), and the task itself completes; any other
// deferral, and a low task's when its due task cannot be enqueued, is asynq's retry of the task
// on its own queue.
func (h handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	gostack.Grow() // asynq runs each task on a goroutine of its own: grown once, while shallow
	id, err := jobIDOf(t.Payload())
	if err != nil {
		return fmt.Errorf("decode task payload: %v: %w", err, asynq.SkipRetry)
	}
	retried, _ := asynq.GetRetryCount(ctx)
	queue, _ := asynq.GetQueueName(ctx)
	taskID, _ := asynq.GetTaskID(ctx)
	lowQueue := queue == h.due.queues.For(jobs.PriorityLow)
	err = h.p.Process(ctx, Delivery{JobID: id, Retried: retried, Low: lowQueue || strings.HasSuffix(taskID, dueSuffix)})
	var d *DeferError
	if !errors.As(err, &d) || !lowQueue {
		return err
	}
	if h.due.enqueueDue(context.WithoutCancel(ctx), id, d.Until, d.Reason) != nil {
		return err // back on the low queue, as before there were due tasks
	}
	return nil
}
