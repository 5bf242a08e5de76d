package dispatch_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// TestSweeper_RespectsLease checks that a running job whose task Redis lost is re-enqueued only
// once its attempt's lease has ended (its delivery died), never while the call may be in flight.
func TestSweeper_RespectsLease(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	job := b.Create(t, jobstest.Opts{})
	_, err := b.Store.BeginAttempt(context.Background(), job.ID)
	require.NoError(t, err)
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: redistest.Client(t)})

	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 0, n, "the attempt's lease is live")
	_, err = tb.inspector.GetTaskInfo(tb.queue, job.ID)
	require.Error(t, err, "nothing was enqueued")

	b.ExpireLease(t, job.ID)
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, asynq.TaskStatePending, tb.state(t, job.ID))

	// The task exists now: the next sweep leaves it alone.
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 0, n)
}

// orphan makes job id's pending task what a SIGKILLed worker leaves: moved to asynq's active
// list and marked active, with no live server listing it.
func orphan(t *testing.T, rdb *redis.Client, queue, id string) {
	t.Helper()
	prefix := "asynq:{" + queue + "}:"
	require.NoError(t, rdb.LRem(t.Context(), prefix+"pending", 0, id).Err())
	require.NoError(t, rdb.LPush(t.Context(), prefix+"active", id).Err())
	require.NoError(t, rdb.HSet(t.Context(), prefix+"t:"+id, "state", "active").Err())
}

// TestSweeper_RescuesOrphans checks that a task left active by a dead worker (no live server
// lists it) is rescued with a second task once it has looked orphaned for OrphanGrace, and not
// before.
func TestSweeper_RescuesOrphans(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	job := b.Create(t, jobstest.Opts{})
	require.NoError(t, tb.enqueuer.Enqueue(t.Context(), job.ID, "", time.Time{}))
	rdb := redistest.Client(t)
	orphan(t, rdb, tb.queue, job.ID)

	now := time.Now()
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb, OrphanGrace: 15 * time.Second, Now: func() time.Time { return now }})
	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 0, n, "first seen orphaned: not yet")
	now = now.Add(14 * time.Second)
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 0, n, "within the grace")
	now = now.Add(2 * time.Second)
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, asynq.TaskStatePending, tb.state(t, job.ID+":rescue"))
	// Seen again right after the rescue: a fresh grace starts (and asynq would refuse a second
	// rescue while the first exists).
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 0, n)
}

// TestSweeper_RescuesALowJobsOrphanedDueTask: a low job whose due task (its deferred delivery,
// on the main queue) a dead worker left active is rescued on the main queue too, not at the
// tail of the low queue behind its backlog; and the rescue's own deferral waits as the rescue
// (asynq's retry), where on the low queue it would end: the orphaned due task holds the job's
// due-task ID, so the deferral could not become a due task, and the job would wait for asynq's
// recoverer (its lease, 30 s more, and up to a minute's interval: 1-2 minutes after the death).
func TestSweeper_RescuesALowJobsOrphanedDueTask(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	rdb := redistest.Client(t)
	q := dispatch.NewQueues(tb.queue)
	job := b.Create(t, jobstest.Opts{Priority: jobs.PriorityLow})
	// Given the job's due task, taken by a worker that died.
	_, err := tb.client.Enqueue(asynq.NewTask(dispatch.TaskType, []byte(`{"job_id":"`+job.ID+`","deferred":"its turn"}`)),
		asynq.TaskID(job.ID+":due"), asynq.Queue(q.Due()))
	require.NoError(t, err)
	orphan(t, rdb, q.Due(), job.ID+":due")

	now := time.Now()
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb, OrphanGrace: 15 * time.Second, Now: func() time.Time { return now }})
	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "first seen orphaned: not yet")
	now = now.Add(16 * time.Second)
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, asynq.TaskStatePending, tb.stateIn(t, q.Due(), job.ID+":rescue"), "rescued on the main queue")
	require.Zero(t, tb.stateIn(t, q.For(jobs.PriorityLow), job.ID+":rescue"), "not behind the low backlog")

	// The rescue's delivery is deferred: it waits as itself for its time.
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	srv := dispatch.NewServer(opt, dispatch.ServerConfig{Queue: tb.queue, Concurrency: 1,
		PollInterval: 10 * time.Millisecond, Policy: retrypolicy.New(&retrypolicy.Config{})})
	p := &deferAlways{}
	require.NoError(t, srv.Start(dispatch.Mux(p, tb.enqueuer)))
	t.Cleanup(srv.Shutdown)
	require.Eventually(t, func() bool { return p.n.Load() == 1 }, 30*time.Second, 5*time.Millisecond)
	srv.Shutdown()
	require.Equal(t, asynq.TaskStateRetry, tb.stateIn(t, q.Due(), job.ID+":rescue"), "the deferral is kept")
}

// TestSweeper_RedisLookupFails checks that a sweep whose look-up of the tasks fails (Redis
// unreachable for the sweeper's client) says so and enqueues nothing: a job whose task state is
// unknown is not taken for one whose task is missing, nor for an orphan.
func TestSweeper_RedisLookupFails(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	job := b.Create(t, jobstest.Opts{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	require.NoError(t, l.Close())
	rdb := redis.NewClient(&redis.Options{Addr: dead, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb})

	n, err := sw.SweepOnce(t.Context())
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Zero(t, n)
	_, err = tb.inspector.GetTaskInfo(tb.queue, job.ID)
	require.ErrorIs(t, err, asynq.ErrQueueNotFound, "nothing was enqueued: the queue was never made")
}

// failPipelines fails every pipeline a client sends (single commands go through).
type failPipelines struct{}

func (failPipelines) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (failPipelines) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (failPipelines) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(context.Context, []redis.Cmder) error { return errPipelineDown }
}

var errPipelineDown = errors.New("pipeline refused")

// TestSweeper_TaskLookupFails checks the walk's own look-up: when the pipelined read of the
// tasks' states fails, the sweep says so and enqueues nothing.
func TestSweeper_TaskLookupFails(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	job := b.Create(t, jobstest.Opts{})
	rdb := redistest.Client(t)
	rdb.AddHook(failPipelines{})
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb})
	n, err := sw.SweepOnce(t.Context())
	require.ErrorIs(t, err, errPipelineDown)
	require.ErrorContains(t, err, "look up tasks")
	require.Zero(t, n)
	_, err = tb.inspector.GetTaskInfo(tb.queue, job.ID)
	require.ErrorIs(t, err, asynq.ErrQueueNotFound, "nothing was enqueued")
}

// TestSweeper_ClockSkew checks that the sweeper measures leases and the fresh grace on Postgres's
// clock, on which they were written, not on its host's: a sweeper whose clock runs ahead neither
// takes a live lease for a dead delivery nor a fresh job (whose first delivery may be running in
// its serve process, Handoff) for one past its grace, so it makes no second task to take a second
// limiter slot; and one whose clock runs behind re-enqueues a job whose lease has ended.
func TestSweeper_ClockSkew(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	ctx := t.Context()
	fresh := b.Create(t, jobstest.Opts{})
	running := b.Create(t, jobstest.Opts{})
	_, err := b.Store.BeginAttempt(ctx, running.ID)
	require.NoError(t, err)
	// The grace runs in real time from fresh's creation to the last pass, which a loaded run can
	// spread over more than a few seconds: 20 s, under the skew (30 s) that would misdate it.
	sweeper := func(skew time.Duration) *dispatch.Sweeper {
		return dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
			Redis: redistest.Client(t), FreshGrace: 20 * time.Second, Now: func() time.Time { return time.Now().Add(skew) }})
	}

	n, err := sweeper(30 * time.Second).SweepOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "the lease is live and the job fresh, on Postgres's clock")
	for _, id := range []string{fresh.ID, running.ID} {
		_, err = tb.inspector.GetTaskInfo(tb.queue, id)
		require.Error(t, err, "nothing was enqueued")
	}

	b.ExpireLease(t, running.ID)
	n, err = sweeper(-30 * time.Second).SweepOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the lease has ended, on Postgres's clock")
	require.Equal(t, asynq.TaskStatePending, tb.state(t, running.ID))
}
