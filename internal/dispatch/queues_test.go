package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

func TestQueues_LowHasItsOwn(t *testing.T) {
	t.Parallel()
	q := dispatch.NewQueues("llmq")
	require.Equal(t, "llmq", q.For(jobs.PriorityHigh))
	require.Equal(t, "llmq", q.For(jobs.PriorityNormal), "normal keeps the queue's own name")
	require.Equal(t, "llmq", q.For(""))
	require.Equal(t, "llmq:low", q.For(jobs.PriorityLow))
	require.Equal(t, []string{"llmq", "llmq:low"}, q.All())
}

// stateIn is the state of task id on queue (0: none there).
func (b *tasksBundle) stateIn(t *testing.T, queue, id string) asynq.TaskState {
	t.Helper()
	info, err := b.inspector.GetTaskInfo(queue, id)
	if errors.Is(err, asynq.ErrQueueNotFound) {
		return 0
	}
	if err != nil {
		require.ErrorIs(t, err, asynq.ErrTaskNotFound)
		return 0
	}
	return info.State
}

// TestTasks_PriorityQueues: a job's task goes on its priority's queue (low: its own), and
// aborting, requeueing and counting find it there.
func TestTasks_PriorityQueues(t *testing.T) {
	t.Parallel()
	b := setupTasks(t)
	ctx := context.Background()
	q := dispatch.NewQueues(b.queue)
	const high, low = "0190a5b2-7c1e-7d3f-9a8b-000000000001", "0190a5b2-7c1e-7d3f-9a8b-000000000002"

	require.NoError(t, b.enqueuer.Enqueue(ctx, high, jobs.PriorityHigh, time.Time{}))
	require.NoError(t, b.enqueuer.Enqueue(ctx, low, jobs.PriorityLow, time.Now().Add(time.Hour)))
	require.NoError(t, b.enqueuer.Enqueue(ctx, taskID, jobs.PriorityNormal, time.Time{}))
	require.Equal(t, asynq.TaskStatePending, b.stateIn(t, b.queue, high))
	require.Equal(t, asynq.TaskStateScheduled, b.stateIn(t, q.For(jobs.PriorityLow), low))
	require.Equal(t, asynq.TaskStatePending, b.stateIn(t, b.queue, taskID))
	d, err := b.tasks.Depth()
	require.NoError(t, err)
	require.Equal(t, dispatch.QueueDepth{Pending: 2, Scheduled: 1}, d, "both queues summed")

	require.NoError(t, b.tasks.Abort(low))
	require.Zero(t, b.stateIn(t, q.For(jobs.PriorityLow), low), "aborted on its own queue")

	// A requeue puts the task on the job's priority's queue and leaves none elsewhere.
	require.NoError(t, b.tasks.Requeue(ctx, taskID, jobs.PriorityLow))
	require.Zero(t, b.stateIn(t, b.queue, taskID))
	require.Equal(t, asynq.TaskStatePending, b.stateIn(t, q.For(jobs.PriorityLow), taskID))
}

// TestSweeper_PriorityQueues: the sweeper looks for a job's task on its priority's queue: a task
// in place there is left alone, a missing one is enqueued there, and an orphan there is rescued.
func TestSweeper_PriorityQueues(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	rdb := redistest.Client(t)
	lowQueue := dispatch.NewQueues(tb.queue).For(jobs.PriorityLow)
	placed := b.Create(t, jobstest.Opts{Priority: jobs.PriorityLow})
	missing := b.Create(t, jobstest.Opts{Priority: jobs.PriorityLow})
	orphaned := b.Create(t, jobstest.Opts{Priority: jobs.PriorityLow})
	require.NoError(t, tb.enqueuer.Enqueue(t.Context(), placed.ID, jobs.PriorityLow, time.Time{}))
	require.NoError(t, tb.enqueuer.Enqueue(t.Context(), orphaned.ID, jobs.PriorityLow, time.Time{}))
	orphan(t, rdb, lowQueue, orphaned.ID)
	now := time.Now()
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb, OrphanGrace: 15 * time.Second, Now: func() time.Time { return now }})

	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n, "only the missing task")
	require.Equal(t, asynq.TaskStatePending, tb.stateIn(t, lowQueue, missing.ID))
	require.Zero(t, tb.stateIn(t, tb.queue, missing.ID), "not on the normal queue")

	now = now.Add(16 * time.Second)
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n, "the orphan, past its grace")
	require.Equal(t, asynq.TaskStatePending, tb.stateIn(t, lowQueue, orphaned.ID+":rescue"))
}

// recorder is a Processor that reports each delivery's job.
type recorder chan string

func (r recorder) Process(ctx context.Context, d dispatch.Delivery) error {
	select {
	case r <- d.JobID:
	case <-ctx.Done():
	}
	return nil
}

// TestServer_HigherPriorityOvertakesABacklog: with 200 low tasks waiting, a normal and a high
// task enqueued after them are among the first deliveries, not the last. One delivery slot, so
// the order of deliveries is the order of dequeues; each dequeue takes a non-empty queue in
// asynq's weighted random order (9:1), so the main queue loses to the low backlog with
// probability 1/10 a dequeue, and its second task is late past the 20th delivery with
// probability ~2e-18.
func TestServer_HigherPriorityOvertakesABacklog(t *testing.T) {
	t.Parallel()
	queue := redistest.Queue(t, redistest.URL())
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	t.Cleanup(func() { require.NoError(t, client.Close()) })
	enq := dispatch.NewEnqueuer(client, queue)
	ctx := t.Context()
	for i := range 200 {
		require.NoError(t, enq.Enqueue(ctx, fmt.Sprintf("low-%d", i), jobs.PriorityLow, time.Time{}))
	}
	require.NoError(t, enq.Enqueue(ctx, "normal", jobs.PriorityNormal, time.Time{}))
	require.NoError(t, enq.Enqueue(ctx, "high", jobs.PriorityHigh, time.Time{}))

	policy := retrypolicy.New(&retrypolicy.Config{})
	srv := dispatch.NewServer(opt, dispatch.ServerConfig{Queue: queue, Concurrency: 1,
		PollInterval: 10 * time.Millisecond, Policy: policy})
	deliveries := make(recorder)
	require.NoError(t, srv.Start(dispatch.Mux(deliveries)))
	t.Cleanup(srv.Shutdown)

	deadline := time.After(10 * time.Second)
	seen := map[string]int{}
	for n := 1; seen["normal"] == 0 || seen["high"] == 0; n++ {
		select {
		case id := <-deliveries:
			seen[id] = n
		case <-deadline:
			t.Fatalf("after %d deliveries: high at %d, normal at %d (0: not yet)", n-1, seen["high"], seen["normal"])
		}
		require.LessOrEqual(t, n, 20, "high at %d, normal at %d (0: not yet)", seen["high"], seen["normal"])
	}
}
