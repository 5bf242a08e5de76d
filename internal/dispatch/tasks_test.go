package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/redistest"
)

type tasksBundle struct {
	tasks     *dispatch.Tasks
	enqueuer  *dispatch.Enqueuer
	inspector *asynq.Inspector
	client    *asynq.Client
	queue     string
}

func setupTasks(t *testing.T) *tasksBundle {
	t.Helper()
	redistest.Client(t) // fails the test when Redis is down
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	insp := asynq.NewInspector(opt)
	queue := redistest.Queue(t, redistest.URL())
	t.Cleanup(func() {
		require.NoError(t, insp.Close())
		require.NoError(t, client.Close())
	})
	enq := dispatch.NewEnqueuer(client, queue, nil)
	return &tasksBundle{tasks: dispatch.NewTasks(insp, enq), enqueuer: enq, inspector: insp, client: client, queue: queue}
}

func (b *tasksBundle) state(t *testing.T, id string) asynq.TaskState {
	t.Helper()
	info, err := b.inspector.GetTaskInfo(b.queue, id)
	if err != nil {
		require.ErrorIs(t, err, asynq.ErrTaskNotFound)
		return 0
	}
	return info.State
}

const taskID = "0190a5b2-7c1e-7d3f-9a8b-123456789abc"

func TestTasks_Abort(t *testing.T) {
	t.Parallel()

	t.Run("DeletesPending", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		require.NoError(t, b.enqueuer.Enqueue(context.Background(), taskID, "", time.Time{}))
		require.Equal(t, asynq.TaskStatePending, b.state(t, taskID))
		require.NoError(t, b.tasks.Abort(taskID))
		require.Zero(t, b.state(t, taskID))
	})
	t.Run("DeletesScheduled", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		require.NoError(t, b.enqueuer.Enqueue(context.Background(), taskID, "", time.Now().Add(time.Hour)))
		require.Equal(t, asynq.TaskStateScheduled, b.state(t, taskID))
		require.NoError(t, b.tasks.Abort(taskID))
		require.Zero(t, b.state(t, taskID))
	})
	t.Run("NoTaskNoQueue", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		require.NoError(t, b.tasks.Abort(taskID))
	})
}

// AbortHeld runs a canceled job's waiting task at once instead of deleting it: the job's row
// still holds a limiter slot, which the task's delivery gives back (see executor).
func TestTasks_AbortHeld(t *testing.T) {
	t.Parallel()

	t.Run("RunsScheduled", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		require.NoError(t, b.enqueuer.Enqueue(context.Background(), taskID, "", time.Now().Add(time.Hour)))
		require.Equal(t, asynq.TaskStateScheduled, b.state(t, taskID))
		require.NoError(t, b.tasks.AbortHeld(taskID))
		require.Equal(t, asynq.TaskStatePending, b.state(t, taskID))
	})
	t.Run("KeepsPending", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		require.NoError(t, b.enqueuer.Enqueue(context.Background(), taskID, "", time.Time{}))
		require.NoError(t, b.tasks.AbortHeld(taskID))
		require.Equal(t, asynq.TaskStatePending, b.state(t, taskID))
	})
	t.Run("NoTaskNoQueue", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		require.NoError(t, b.tasks.AbortHeld(taskID))
	})
}

func TestTasks_Requeue(t *testing.T) {
	t.Parallel()

	t.Run("ReplacesArchived", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		ctx := context.Background()
		require.NoError(t, b.enqueuer.Enqueue(ctx, taskID, "", time.Time{}))
		require.NoError(t, b.inspector.ArchiveTask(b.queue, taskID))
		require.Equal(t, asynq.TaskStateArchived, b.state(t, taskID))
		// A plain enqueue is a no-op while the archived task exists...
		require.NoError(t, b.enqueuer.Enqueue(ctx, taskID, "", time.Time{}))
		require.Equal(t, asynq.TaskStateArchived, b.state(t, taskID))
		// ...Requeue replaces it.
		require.NoError(t, b.tasks.Requeue(ctx, taskID, ""))
		require.Equal(t, asynq.TaskStatePending, b.state(t, taskID))
	})
	t.Run("Fresh", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		require.NoError(t, b.tasks.Requeue(context.Background(), taskID, ""))
		require.Equal(t, asynq.TaskStatePending, b.state(t, taskID))
	})
	// The task of a job retried the moment it died is still active (the dying delivery has
	// recorded the death and not yet returned): asynq refuses a second task of its ID, and the
	// enqueue was silently a no-op; once the active one ended, the job, queued, had no task
	// until a sweep found it (a lap of the backlog), though the operator was told "requeued".
	// Requeue enqueues a rescue task (its own ID) instead, which runs the job.
	t.Run("ActiveTaskGetsARescue", func(t *testing.T) {
		t.Parallel()
		b := setupTasks(t)
		ctx := context.Background()
		require.NoError(t, b.enqueuer.Enqueue(ctx, taskID, "", time.Time{}))
		orphan(t, redistest.Client(t), b.queue, taskID) // active, as a delivery's
		require.NoError(t, b.tasks.Requeue(ctx, taskID, ""))
		require.Equal(t, asynq.TaskStateActive, b.state(t, taskID), "a running delivery is left alone")
		require.Equal(t, asynq.TaskStatePending, b.state(t, taskID+":rescue"), "a task that runs the job after it")
	})
}

func TestTasks_Depth(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	ctx := context.Background()

	d, err := b.tasks.Depth()
	require.NoError(t, err)
	require.Equal(t, dispatch.QueueDepth{}, d, "a queue that never held a task")

	require.NoError(t, b.enqueuer.Enqueue(ctx, taskID, "", time.Time{}))
	require.NoError(t, b.enqueuer.Enqueue(ctx, "0190a5b2-7c1e-7d3f-9a8b-000000000001", "", time.Now().Add(time.Hour)))
	d, err = b.tasks.Depth()
	require.NoError(t, err)
	require.Equal(t, dispatch.QueueDepth{Pending: 1, Scheduled: 1}, d)
}
