package jobs_test

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

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// expireLease ends job id's attempt lease as if its delivery had died AttemptLease ago.
func (b *storeBundle) expireLease(t *testing.T, id string) {
	t.Helper()
	_, err := b.pool.Exec(t.Context(), `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)
}

func TestStore_AttemptLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OneCallInFlight", func(t *testing.T) {
		t.Parallel()
		b := setupStore(t)
		job := b.create(t, jobOpts{})
		first, err := b.store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		require.NotNil(t, first.LeaseToken)
		require.True(t, first.Leased(time.Now()))
		require.WithinDuration(t, time.Now().Add(jobs.AttemptLease), *first.LeaseUntil, 5*time.Second)

		// A duplicate delivery cannot begin a second call while the first holds the lease.
		_, err = b.store.BeginAttempt(ctx, job.ID)
		var leased *jobs.LeasedError
		require.ErrorAs(t, err, &leased)
		require.True(t, leased.Until.Equal(*first.LeaseUntil))
		got, err := b.store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, 1, got.Attempts, "the refused delivery counted no attempt")

		// Renewing moves the end; Finish with the attempt's token releases it.
		ok, err := b.store.RenewLease(ctx, job.ID, *first.LeaseToken)
		require.NoError(t, err)
		require.True(t, ok)
		next := time.Now().Add(time.Second)
		applied, err := b.store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(),
			Class: "server_error", StatusCode: 503, LeaseToken: *first.LeaseToken},
			jobs.Outcome{Status: jobs.StatusRetrying, NextAttemptAt: &next, LastError: &jobs.LastError{Class: "server_error", Message: "x"}})
		require.NoError(t, err)
		require.True(t, applied)
		got, err = b.store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Nil(t, got.LeaseToken)
		require.Nil(t, got.LeaseUntil)
		ok, err = b.store.RenewLease(ctx, job.ID, *first.LeaseToken)
		require.NoError(t, err)
		require.False(t, ok, "a released lease cannot be renewed")

		second, err := b.store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, 2, second.Attempts)
	})

	t.Run("DeadDeliveryTakenOver", func(t *testing.T) {
		t.Parallel()
		b := setupStore(t)
		job := b.create(t, jobOpts{})
		dead, err := b.store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		b.expireLease(t, job.ID)
		taker, err := b.store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		require.NotEqual(t, *dead.LeaseToken, *taker.LeaseToken)
		require.Equal(t, 2, taker.Attempts)

		// The old delivery, if it was only slow, can neither renew nor release the new lease.
		ok, err := b.store.RenewLease(ctx, job.ID, *dead.LeaseToken)
		require.NoError(t, err)
		require.False(t, ok)
		next := time.Now()
		_, err = b.store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "default", StartedAt: time.Now(),
			Class: "timeout", LeaseToken: *dead.LeaseToken},
			jobs.Outcome{Status: jobs.StatusRetrying, NextAttemptAt: &next, LastError: &jobs.LastError{Class: "timeout", Message: "x"}})
		require.NoError(t, err)
		got, err := b.store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, taker.LeaseToken, got.LeaseToken)
	})

	t.Run("TerminalIsNotRunnable", func(t *testing.T) {
		t.Parallel()
		b := setupStore(t)
		job := b.create(t, jobOpts{})
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
		_, err := b.store.BeginAttempt(ctx, job.ID)
		require.ErrorIs(t, err, jobs.ErrNotRunnable)
	})
}

// TestSweeper_RespectsLease checks that a running job whose task Redis lost is re-enqueued only
// once its attempt's lease has ended (its delivery died), never while the call may be in flight.
func TestSweeper_RespectsLease(t *testing.T) {
	t.Parallel()
	b := setupStore(t)
	tb := setupTasks(t)
	job := b.create(t, jobOpts{})
	_, err := b.store.BeginAttempt(context.Background(), job.ID)
	require.NoError(t, err)
	sw := jobs.NewSweeper(jobs.SweeperConfig{Store: b.store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: redistest.Client(t), Queue: tb.queue})

	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 0, n, "the attempt's lease is live")
	_, err = tb.inspector.GetTaskInfo(tb.queue, job.ID)
	require.Error(t, err, "nothing was enqueued")

	b.expireLease(t, job.ID)
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
	b := setupStore(t)
	tb := setupTasks(t)
	job := b.create(t, jobOpts{})
	require.NoError(t, tb.enqueuer.Enqueue(t.Context(), job.ID, time.Time{}))
	rdb := redistest.Client(t)
	orphan(t, rdb, tb.queue, job.ID)

	now := time.Now()
	sw := jobs.NewSweeper(jobs.SweeperConfig{Store: b.store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb, Queue: tb.queue, OrphanGrace: 15 * time.Second, Now: func() time.Time { return now }})
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

// TestStore_CrashedJobWaits checks that a job whose attempt's delivery died (running, lease
// ended) can hold a limiter slot and be postponed like a queued one, while a live attempt's job
// cannot.
func TestStore_CrashedJobWaits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupStore(t)
	job := b.create(t, jobOpts{})
	_, err := b.store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	at := time.Now().Add(time.Minute).Truncate(time.Millisecond)

	require.NoError(t, b.store.HoldSlot(ctx, job.ID, at, 7, 3))
	got, err := b.store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Nil(t, got.SlotSeq, "a live attempt's job is not waiting")

	b.expireLease(t, job.ID)
	require.NoError(t, b.store.HoldSlot(ctx, job.ID, at, 7, 3))
	got, err = b.store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, int64(7), *got.SlotSeq)
	require.Equal(t, int64(3), *got.SlotGrant)
	require.True(t, at.Equal(*got.NextAttemptAt))

	later := at.Add(time.Minute)
	require.NoError(t, b.store.Postpone(ctx, job.ID, later))
	got, err = b.store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.True(t, later.Equal(*got.NextAttemptAt))
}

// TestSweeper_RedisLookupFails checks that a sweep whose look-up of the tasks fails (Redis
// unreachable for the sweeper's client) says so and enqueues nothing: a job whose task state is
// unknown is not taken for one whose task is missing, nor for an orphan.
func TestSweeper_RedisLookupFails(t *testing.T) {
	t.Parallel()
	b := setupStore(t)
	tb := setupTasks(t)
	job := b.create(t, jobOpts{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := l.Addr().String()
	require.NoError(t, l.Close())
	rdb := redis.NewClient(&redis.Options{Addr: dead, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	sw := jobs.NewSweeper(jobs.SweeperConfig{Store: b.store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb, Queue: tb.queue})

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
	b := setupStore(t)
	tb := setupTasks(t)
	job := b.create(t, jobOpts{})
	rdb := redistest.Client(t)
	rdb.AddHook(failPipelines{})
	sw := jobs.NewSweeper(jobs.SweeperConfig{Store: b.store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb, Queue: tb.queue})
	n, err := sw.SweepOnce(t.Context())
	require.ErrorIs(t, err, errPipelineDown)
	require.ErrorContains(t, err, "look up tasks")
	require.Zero(t, n)
	_, err = tb.inspector.GetTaskInfo(tb.queue, job.ID)
	require.ErrorIs(t, err, asynq.ErrQueueNotFound, "nothing was enqueued")
}
