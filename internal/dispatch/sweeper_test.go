package dispatch_test

import (
	"slices"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/redistest"
)

// sweepFixture is n queued jobs, in ID order, and a sweeper checking passJobs of them a pass.
func sweepFixture(t *testing.T, n, passJobs int) (*jobstest.Bundle, *tasksBundle, *dispatch.Sweeper, []string) {
	t.Helper()
	b := jobstest.New(t)
	tb := setupTasks(t)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = b.Create(t, jobstest.Opts{}).ID
	}
	slices.Sort(ids)
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: redistest.Client(t), PassJobs: passJobs})
	return b, tb, sw, ids
}

// TestSweeper_PassJobsBoundsAPass checks that while every task is in place a pass checks only
// PassJobs jobs, the next goes on from there, and a job whose task is missing is still found
// when its turn comes: a pass's cost does not grow with the backlog.
func TestSweeper_PassJobsBoundsAPass(t *testing.T) {
	t.Parallel()
	_, tb, sw, ids := sweepFixture(t, 5, 2)
	for _, id := range ids[:4] {
		require.NoError(t, tb.enqueuer.Enqueue(t.Context(), id, "", time.Time{}))
	}
	for pass, want := range []int{0, 0, 1, 0} {
		n, err := sw.SweepOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, want, n, "pass %d", pass+1)
	}
	require.NotZero(t, tb.state(t, ids[4]), "the last job's task was enqueued on the pass that reached it")
}

// TestSweeper_MissingTasksFinishThePass checks that a pass that finds a job without its task (a
// Redis flush) goes on past PassJobs to the end, so recovery takes one pass.
func TestSweeper_MissingTasksFinishThePass(t *testing.T) {
	t.Parallel()
	_, tb, sw, ids := sweepFixture(t, 5, 2)
	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 5, n)
	for _, id := range ids {
		require.NotZero(t, tb.state(t, id))
	}
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestSweeper_OrphansFoundWhateverTheBacklog checks that an orphaned task is found among asynq's
// active tasks, not by the walk for missing tasks: it is rescued once OrphanGrace has passed even
// though the walk, a few jobs a pass, has not reached its job.
func TestSweeper_OrphansFoundWhateverTheBacklog(t *testing.T) {
	t.Parallel()
	b, tb, _, ids := sweepFixture(t, 6, 2)
	rdb := redistest.Client(t)
	for _, id := range ids {
		require.NoError(t, tb.enqueuer.Enqueue(t.Context(), id, "", time.Time{}))
	}
	orphan(t, rdb, tb.queue, ids[5])
	now := time.Now()
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb, PassJobs: 2, OrphanGrace: 15 * time.Second, Now: func() time.Time { return now }})
	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "first seen orphaned (the walk checked ids[0..1])")
	now = now.Add(16 * time.Second)
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n, "past the grace (the walk checked ids[2..3])")
	require.NotZero(t, tb.state(t, ids[5]+":rescue"))
}

// TestSweeper_RecoveryFromMidTable checks that a pass that begins part-way through the table (a
// large backlog) and finds tasks missing goes round to the jobs before where it began: after a
// Redis flush every job is enqueued again in one pass.
func TestSweeper_RecoveryFromMidTable(t *testing.T) {
	t.Parallel()
	_, tb, sw, ids := sweepFixture(t, 5, 2)
	for _, id := range ids {
		require.NoError(t, tb.enqueuer.Enqueue(t.Context(), id, "", time.Time{}))
	}
	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "ids[0..1] checked: the next pass begins at ids[2]")
	// What a flush does to the tasks (the queue's registration, which the asynq client does not
	// make again, stays).
	rdb := redistest.Client(t)
	keys := []string{"asynq:{" + tb.queue + "}:pending"}
	for _, id := range ids {
		keys = append(keys, "asynq:{"+tb.queue+"}:t:"+id)
	}
	require.NoError(t, rdb.Del(t.Context(), keys...).Err())
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 5, n, "ids[2..4], then round to ids[0..1]")
	for _, id := range ids {
		require.NotZero(t, tb.state(t, id))
	}
}

// TestSweeper_FreshGraceSparesNewJobs checks that a job created a moment ago, never tried nor
// deferred, whose first delivery may be running in the serve process that created it (Handoff),
// is not enqueued while within FreshGrace, and is once the grace has passed; while jobs that are
// not fresh (deferred, tried, or queued again after an attempt) are enqueued at once within it.
func TestSweeper_FreshGraceSparesNewJobs(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	ctx := t.Context()
	fresh := b.Create(t, jobstest.Opts{})
	postponed := b.Create(t, jobstest.Opts{})
	until := time.Now().Add(time.Hour)
	require.NoError(t, b.Store.Postpone(ctx, postponed.ID, postponed.CredentialIndex, until))
	retrying := b.Create(t, jobstest.Opts{})
	b.Attempt(t, retrying.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	requeued := b.Create(t, jobstest.Opts{}) // queued, with an attempt behind it
	_, err := b.Pool.Exec(ctx, `UPDATE jobs SET attempts = 1 WHERE id = $1`, requeued.ID)
	require.NoError(t, err)

	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: redistest.Client(t), FreshGrace: time.Minute})
	n, err := sw.SweepOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n, "the jobs that are not fresh")
	require.Zero(t, tb.state(t, fresh.ID), "within the grace")
	require.Equal(t, asynq.TaskStateScheduled, tb.state(t, postponed.ID))
	info, err := tb.inspector.GetTaskInfo(tb.queue, postponed.ID)
	require.NoError(t, err)
	require.Equal(t, until.Unix(), info.NextProcessAt.Unix(), "at its next attempt's time")
	require.Equal(t, asynq.TaskStatePending, tb.state(t, retrying.ID))
	require.Equal(t, asynq.TaskStatePending, tb.state(t, requeued.ID))

	// Past created_at + FreshGrace, on Postgres's clock (the grace is measured on it).
	_, err = b.Pool.Exec(ctx, `UPDATE jobs SET created_at = created_at - interval '2 minutes' WHERE id = $1`, fresh.ID)
	require.NoError(t, err)
	n, err = sw.SweepOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the fresh job, past its grace")
	require.Equal(t, asynq.TaskStatePending, tb.state(t, fresh.ID))
}

// TestSweeper_DatesItsLastSuccessfulPass: a pass that succeeds sets
// llmq_sweeper_last_success_timestamp_seconds to its start, which the LLMQSweeperStalled rule
// reads; one that fails leaves it where it was. The series is there at 0 before any pass.
func TestSweeper_DatesItsLastSuccessfulPass(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	tb := setupTasks(t)
	reg := prometheus.NewRegistry()
	clock := clocktest.New(time.Now())
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: redistest.Client(t), Metrics: dispatch.NewMetrics(reg), Now: clock.Now})
	const name = "llmq_sweeper_last_success_timestamp_seconds"
	value := func() float64 {
		t.Helper()
		n, err := testutil.GatherAndCount(reg, name)
		require.NoError(t, err)
		require.Equal(t, 1, n, "%s: one series, from the start", name)
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return -1
	}
	require.Zero(t, value(), "no pass yet")

	t0 := clock.Now()
	_, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, float64(t0.UnixNano())/1e9, value())

	// A pass that fails (its first statement cannot run) is not a success.
	_, err = b.Pool.Exec(t.Context(), `ALTER TABLE job_watches RENAME TO job_watches_gone`)
	require.NoError(t, err)
	clock.Advance(time.Minute)
	_, err = sw.SweepOnce(t.Context())
	require.Error(t, err)
	require.Equal(t, float64(t0.UnixNano())/1e9, value())
}
