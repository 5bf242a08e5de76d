package jobs_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// sweepFixture is n queued jobs, in ID order, and a sweeper checking passJobs of them a pass.
func sweepFixture(t *testing.T, n, passJobs int) (*storeBundle, *tasksBundle, *jobs.Sweeper, []string) {
	t.Helper()
	b := setupStore(t)
	tb := setupTasks(t)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = b.create(t, jobOpts{}).ID
	}
	slices.Sort(ids)
	sw := jobs.NewSweeper(jobs.SweeperConfig{Store: b.store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: redistest.Client(t), Queue: tb.queue, PassJobs: passJobs})
	return b, tb, sw, ids
}

// TestSweeper_PassJobsBoundsAPass checks that while every task is in place a pass checks only
// PassJobs jobs, the next goes on from there, and a job whose task is missing is still found
// when its turn comes: a pass's cost does not grow with the backlog.
func TestSweeper_PassJobsBoundsAPass(t *testing.T) {
	t.Parallel()
	_, tb, sw, ids := sweepFixture(t, 5, 2)
	for _, id := range ids[:4] {
		require.NoError(t, tb.enqueuer.Enqueue(t.Context(), id, time.Time{}))
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

// TestSweeper_SuspectsKeptAcrossPasses checks that an orphan seen by one pass keeps its first
// sighting while the passes that do not reach it run, and is rescued on the next pass that does
// once OrphanGrace has passed.
func TestSweeper_SuspectsKeptAcrossPasses(t *testing.T) {
	t.Parallel()
	b, tb, _, ids := sweepFixture(t, 4, 2)
	rdb := redistest.Client(t)
	for _, id := range ids {
		require.NoError(t, tb.enqueuer.Enqueue(t.Context(), id, time.Time{}))
	}
	// ids[0]'s worker was SIGKILLed: its task is active and no live server lists it.
	require.NoError(t, rdb.HSet(t.Context(), "asynq:{"+tb.queue+"}:t:"+ids[0], "state", "active").Err())
	now := time.Now()
	sw := jobs.NewSweeper(jobs.SweeperConfig{Store: b.store, Enqueuer: tb.enqueuer, Inspector: tb.inspector,
		Redis: rdb, Queue: tb.queue, PassJobs: 2, OrphanGrace: 15 * time.Second, Now: func() time.Time { return now }})
	sweep := func() int {
		n, err := sw.SweepOnce(t.Context())
		require.NoError(t, err)
		return n
	}
	require.Zero(t, sweep(), "ids[0..1]: the orphan is first seen")
	now = now.Add(10 * time.Second)
	require.Zero(t, sweep(), "ids[2..3]: the orphan is not reached")
	now = now.Add(10 * time.Second)
	require.Zero(t, sweep(), "past ids[3]: the end, nothing")
	now = now.Add(10 * time.Second)
	require.Equal(t, 1, sweep(), "ids[0..1] again: 30 s since first seen, past the grace")
	require.NotZero(t, tb.state(t, ids[0]+":rescue"))
}

// TestSweeper_RecoveryFromMidTable checks that a pass that begins part-way through the table (a
// large backlog) and finds tasks missing goes round to the jobs before where it began: after a
// Redis flush every job is enqueued again in one pass.
func TestSweeper_RecoveryFromMidTable(t *testing.T) {
	t.Parallel()
	_, tb, sw, ids := sweepFixture(t, 5, 2)
	for _, id := range ids {
		require.NoError(t, tb.enqueuer.Enqueue(t.Context(), id, time.Time{}))
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
