package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// blockedDelivery is a Processor whose delivery tells started its job and runs until its
// context ends, as a provider call does, then tells ended why.
type blockedDelivery struct {
	started chan string
	ended   chan error
}

func (p blockedDelivery) Process(ctx context.Context, d dispatch.Delivery) error {
	select {
	case p.started <- d.JobID:
	default:
	}
	<-ctx.Done()
	select {
	case p.ended <- ctx.Err():
	default:
	}
	return nil
}

// TestTasks_AbortReachesTheRescueTask: a dead job an operator retried while its task was still
// active runs under its rescue task (Tasks.Requeue), and keeps it for the rest of its life (a
// deferral on the main queue is the rescue's own retry). A cancel (Tasks.Abort) neither signaled
// nor deleted the rescue task: the canceled job's call went on until its lease's next renewal
// (up to 5 s of a paid call, a stream's tokens), and a waiting rescue was still delivered.
func TestTasks_AbortReachesTheRescueTask(t *testing.T) {
	t.Parallel()

	t.Run("SignalsARunningOne", func(t *testing.T) {
		t.Parallel()
		q := newServedQueue(t)
		insp := asynq.NewInspector(q.opt)
		t.Cleanup(func() { require.NoError(t, insp.Close()) })
		tasks := dispatch.NewTasks(insp, q.enq)
		p := blockedDelivery{started: make(chan string, 1), ended: make(chan error, 1)}
		srv := dispatch.NewServer(q.opt, dispatch.ServerConfig{Queue: q.name, Concurrency: 1,
			PollInterval: 10 * time.Millisecond, Policy: retrypolicy.New(&retrypolicy.Config{}),
			ShutdownTimeout: time.Second})
		require.NoError(t, srv.Start(dispatch.Mux(p, q.enq)))
		t.Cleanup(srv.Shutdown)

		require.NoError(t, q.enq.EnqueueRescue(t.Context(), taskID, jobs.PriorityNormal))
		select {
		case id := <-p.started:
			require.Equal(t, taskID, id)
		case <-time.After(30 * time.Second):
			t.Fatal("the rescue task was not delivered within 30s")
		}
		// The server's subscription to asynq's cancelation channel may not be in place yet:
		// abort until the delivery ends.
		var endErr error
		require.Eventually(t, func() bool {
			if err := tasks.Abort(taskID); err != nil {
				return false
			}
			select {
			case endErr = <-p.ended:
				return true
			default:
				return false
			}
		}, 15*time.Second, 50*time.Millisecond, "the abort did not end the rescue's delivery")
		require.ErrorIs(t, endErr, context.Canceled)
	})
	t.Run("DeletesAWaitingOne", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		require.NoError(t, b.enqueuer.EnqueueRescue(t.Context(), taskID, jobs.PriorityNormal))
		require.Equal(t, asynq.TaskStatePending, b.state(t, taskID+":rescue"))
		require.NoError(t, b.tasks.Abort(taskID))
		require.Zero(t, b.state(t, taskID+":rescue"), "a canceled job's rescue is not delivered")
	})
	// An archived rescue (asynq's tools) refused the rescue Requeue enqueues for a job whose
	// task is active: the retried job had no task to run it once the active one ended.
	t.Run("RequeueReplacesAnArchivedOne", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		ctx := t.Context()
		require.NoError(t, b.enqueuer.EnqueueRescue(ctx, taskID, jobs.PriorityNormal))
		require.NoError(t, b.inspector.ArchiveTask(b.queue, taskID+":rescue"))
		require.NoError(t, b.enqueuer.Enqueue(ctx, taskID, "", time.Time{}))
		orphan(t, redistest.Client(t), b.queue, taskID) // active, as a delivery's
		require.NoError(t, b.tasks.Requeue(ctx, taskID, ""))
		require.Equal(t, asynq.TaskStatePending, b.state(t, taskID+":rescue"))
	})
}
