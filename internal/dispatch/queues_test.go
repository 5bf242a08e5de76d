package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
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
	require.Equal(t, "llmq", q.Due(), "a low job's deferred delivery comes back on the main queue")
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

// servedQueue is a fresh llmq queue on the test Redis and its Enqueuer.
type servedQueue struct {
	name string
	opt  asynq.RedisConnOpt
	enq  *dispatch.Enqueuer
}

func newServedQueue(t *testing.T) *servedQueue {
	t.Helper()
	name := redistest.Queue(t, redistest.URL())
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	t.Cleanup(func() { require.NoError(t, client.Close()) })
	return &servedQueue{name: name, opt: opt, enq: dispatch.NewEnqueuer(client, name, nil)}
}

// serveOneAtATime starts a worker server on the queue with one delivery slot (so the order of
// deliveries is the order of dequeues), delivering to p, until the test ends.
func (q *servedQueue) serveOneAtATime(t *testing.T, p dispatch.Processor) {
	t.Helper()
	srv := dispatch.NewServer(q.opt, dispatch.ServerConfig{Queue: q.name, Concurrency: 1,
		PollInterval: 10 * time.Millisecond, Policy: retrypolicy.New(&retrypolicy.Config{})})
	require.NoError(t, srv.Start(dispatch.Mux(p, q.enq)))
	t.Cleanup(srv.Shutdown)
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
	q := newServedQueue(t)
	ctx := t.Context()
	for i := range 200 {
		require.NoError(t, q.enq.Enqueue(ctx, fmt.Sprintf("low-%d", i), jobs.PriorityLow, time.Time{}))
	}
	require.NoError(t, q.enq.Enqueue(ctx, "normal", jobs.PriorityNormal, time.Time{}))
	require.NoError(t, q.enq.Enqueue(ctx, "high", jobs.PriorityHigh, time.Time{}))
	deliveries := make(recorder)
	q.serveOneAtATime(t, deliveries)

	deadline := time.After(30 * time.Second)
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

// deferOnce is a Processor that defers the first delivery of job "x" (to now) and reports every
// other delivery's job.
type deferOnce struct {
	deliveries recorder
	deferred   atomic.Bool
}

func (p *deferOnce) Process(ctx context.Context, d dispatch.Delivery) error {
	if d.JobID == "x" && p.deferred.CompareAndSwap(false, true) {
		return &dispatch.DeferError{Until: time.Now(), Reason: "its turn is now"}
	}
	return p.deliveries.Process(ctx, d)
}

// TestServer_DeferredLowTaskComesBackAheadOfABacklog: a low job's task deferred to now comes
// back among the next deliveries, not behind the 200 low tasks that were waiting on its queue
// (where asynq's own retry would put it: the limiter's turn would pass while the workers went
// through them). One delivery slot; each dequeue takes the main queue, where the deferred
// delivery comes back, with probability 9/10, so x is later than the 20th delivery with
// probability 1e-20.
func TestServer_DeferredLowTaskComesBackAheadOfABacklog(t *testing.T) {
	t.Parallel()
	q := newServedQueue(t)
	ctx := t.Context()
	require.NoError(t, q.enq.Enqueue(ctx, "x", jobs.PriorityLow, time.Time{}))
	for i := range 200 {
		require.NoError(t, q.enq.Enqueue(ctx, fmt.Sprintf("b-%d", i), jobs.PriorityLow, time.Time{}))
	}
	p := &deferOnce{deliveries: make(recorder, 256)} // never blocks: the server stops at once
	q.serveOneAtATime(t, p)

	deadline := time.After(20 * time.Second)
	for n := 1; ; n++ {
		select {
		case id := <-p.deliveries:
			if id == "x" {
				return
			}
		case <-deadline:
			t.Fatalf("x had not come back after %d deliveries", n-1)
		}
		require.LessOrEqual(t, n, 20, "x had not come back after 20 of the backlog's deliveries")
	}
}

// deferAlways is a Processor that defers every delivery an hour and counts them.
type deferAlways struct{ n atomic.Int32 }

func (p *deferAlways) Process(context.Context, dispatch.Delivery) error {
	p.n.Add(1)
	return &dispatch.DeferError{Until: time.Now().Add(time.Hour), Reason: "later"}
}

// TestServer_DeferralsWaitAsDueTasks: a deferred task of the low queue becomes the job's due task
// on the main queue and ends; a due task deferred again stays itself (asynq's retry), and so does
// a deferred task of the main queue; a deferral of the job's low task while its due task exists
// just ends that task. The sweeper finds the job's task in place, abort deletes it.
func TestServer_DeferralsWaitAsDueTasks(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	q := dispatch.NewQueues(tb.queue)
	low, due := q.For(jobs.PriorityLow), q.Due()
	job := b.Create(t, jobstest.Opts{Priority: jobs.PriorityLow})
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	srv := dispatch.NewServer(opt, dispatch.ServerConfig{Queue: tb.queue, Concurrency: 1,
		PollInterval: 10 * time.Millisecond, Policy: retrypolicy.New(&retrypolicy.Config{})})
	p := &deferAlways{}
	require.NoError(t, srv.Start(dispatch.Mux(p, tb.enqueuer)))
	t.Cleanup(srv.Shutdown)
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		require.Eventually(t, cond, 30*time.Second, 5*time.Millisecond, what)
	}

	require.NoError(t, tb.enqueuer.Enqueue(t.Context(), job.ID, jobs.PriorityLow, time.Time{}))
	waitFor("the low task's deferral makes a due task", func() bool {
		return tb.stateIn(t, due, job.ID+":due") == asynq.TaskStateScheduled
	})
	waitFor("and the task itself ends", func() bool { return tb.stateIn(t, low, job.ID) == 0 })
	info, err := tb.inspector.GetTaskInfo(due, job.ID+":due")
	require.NoError(t, err)
	require.JSONEq(t, `{"job_id":"`+job.ID+`","deferred":"later"}`, string(info.Payload), "it names why it waits")

	require.NoError(t, tb.inspector.RunTask(due, job.ID+":due"))
	waitFor("the due task, deferred again, waits as itself", func() bool {
		return tb.stateIn(t, due, job.ID+":due") == asynq.TaskStateRetry
	})
	require.EqualValues(t, 2, p.n.Load())

	require.NoError(t, tb.enqueuer.Enqueue(t.Context(), job.ID, jobs.PriorityLow, time.Time{}))
	waitFor("a duplicate's deferral ends the duplicate", func() bool {
		return p.n.Load() == 3 && tb.stateIn(t, low, job.ID) == 0
	})
	require.Equal(t, asynq.TaskStateRetry, tb.stateIn(t, due, job.ID+":due"), "the due task is untouched")

	normal := b.Create(t, jobstest.Opts{})
	require.NoError(t, tb.enqueuer.Enqueue(t.Context(), normal.ID, jobs.PriorityNormal, time.Time{}))
	waitFor("a main queue task's deferral is its own retry", func() bool {
		return tb.stateIn(t, tb.queue, normal.ID) == asynq.TaskStateRetry
	})
	require.Zero(t, tb.stateIn(t, due, normal.ID+":due"))
	srv.Shutdown() // what follows reads the queues as the sweeper and an operator find them

	rdb := redistest.Client(t)
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector, Redis: rdb})
	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "the due task counts as the low job's task")
	d, err := tb.tasks.Depth()
	require.NoError(t, err)
	require.Equal(t, dispatch.QueueDepth{Retry: 2}, d)

	require.NoError(t, tb.tasks.Abort(job.ID))
	require.Zero(t, tb.stateIn(t, due, job.ID+":due"), "abort deletes the due task")
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n, "with no task left, the sweeper enqueues one")
	require.Equal(t, asynq.TaskStatePending, tb.stateIn(t, low, job.ID), "on the job's own queue")
}

// TestServer_LowDeferralStaysWhenItsDueTaskCannotBeEnqueued: when the due task cannot be
// enqueued (here the handler's client is closed), the deferred low task is not lost: it waits as
// itself on the low queue (asynq's retry), as before there were due tasks.
func TestServer_LowDeferralStaysWhenItsDueTaskCannotBeEnqueued(t *testing.T) {
	t.Parallel()
	tb := setupTasks(t)
	q := dispatch.NewQueues(tb.queue)
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	closed := asynq.NewClient(opt)
	require.NoError(t, closed.Close())
	srv := dispatch.NewServer(opt, dispatch.ServerConfig{Queue: tb.queue, Concurrency: 1,
		PollInterval: 10 * time.Millisecond, Policy: retrypolicy.New(&retrypolicy.Config{})})
	require.NoError(t, srv.Start(dispatch.Mux(&deferAlways{}, dispatch.NewEnqueuer(closed, tb.queue, nil))))
	t.Cleanup(srv.Shutdown)

	require.NoError(t, tb.enqueuer.Enqueue(t.Context(), taskID, jobs.PriorityLow, time.Time{}))
	require.Eventually(t, func() bool {
		return tb.stateIn(t, q.For(jobs.PriorityLow), taskID) == asynq.TaskStateRetry
	}, 30*time.Second, 5*time.Millisecond, "the deferred low task waits as itself")
	require.Zero(t, tb.stateIn(t, q.Due(), taskID+":due"), "no due task")
}

// lowRecorder is a Processor that hands each delivery to deliveries and defers the first
// delivery of job "x" to now (so that it comes back as x's due task).
type lowRecorder struct {
	deliveries chan dispatch.Delivery
	deferred   atomic.Bool
}

func (p *lowRecorder) Process(ctx context.Context, d dispatch.Delivery) error {
	select {
	case p.deliveries <- d:
	case <-ctx.Done():
	}
	if d.JobID == "x" && p.deferred.CompareAndSwap(false, true) {
		return &dispatch.DeferError{Until: time.Now(), Reason: "its turn is now"}
	}
	return nil
}

// TestServer_DeliveriesSayWhetherTheJobIsLow: the delivery of a low job's task, and of its due
// task (which comes on the main queue), is Low; a normal job's is not.
func TestServer_DeliveriesSayWhetherTheJobIsLow(t *testing.T) {
	t.Parallel()
	q := newServedQueue(t)
	ctx := t.Context()
	require.NoError(t, q.enq.Enqueue(ctx, "x", jobs.PriorityLow, time.Time{}))
	require.NoError(t, q.enq.Enqueue(ctx, "n", jobs.PriorityNormal, time.Time{}))
	p := &lowRecorder{deliveries: make(chan dispatch.Delivery, 16)} // never blocks: the server stops at once
	q.serveOneAtATime(t, p)

	low := map[string][]bool{}
	deadline := time.After(20 * time.Second)
	for len(low["x"]) < 2 || len(low["n"]) < 1 {
		select {
		case d := <-p.deliveries:
			low[d.JobID] = append(low[d.JobID], d.Low)
		case <-deadline:
			t.Fatalf("deliveries so far: %v", low)
		}
	}
	require.Equal(t, map[string][]bool{"x": {true, true}, "n": {false}}, low)
}
