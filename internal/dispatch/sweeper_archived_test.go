package dispatch_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redistest"
)

// TestSweeper_ReplacesAnArchivedTask: Postgres is the source of truth. A job waiting in Postgres
// whose task asynq holds archived (an operator's archive in asynq's tools, a task whose
// delivery failed for good) is never run from it; the sweeper took the archived task for one in
// place, and the job waited, unattempted, until its deadline failed it. The sweeper replaces it
// with a pending task, as it enqueues a missing one.
func TestSweeper_ReplacesAnArchivedTask(t *testing.T) {
	t.Parallel()
	_, tb, sw, ids := sweepFixture(t, 2, 10)
	for _, id := range ids {
		require.NoError(t, tb.enqueuer.Enqueue(t.Context(), id, "", time.Time{}))
	}
	require.NoError(t, tb.inspector.ArchiveTask(tb.queue, ids[0]))
	require.Equal(t, asynq.TaskStateArchived, tb.state(t, ids[0]))

	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n, "the archived task was replaced")
	require.Equal(t, asynq.TaskStatePending, tb.state(t, ids[0]))
	require.Equal(t, asynq.TaskStatePending, tb.state(t, ids[1]), "a pending task is left alone")
	n, err = sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n)
}

// TestSweeper_ARescueTaskIsInPlace: a dead job an operator retried while its task was still
// active runs under a rescue task (Tasks.Requeue), its own task gone once the active delivery
// ended. The sweeper's walk took the job for one without a task and enqueued its own task too:
// a second delivery of every attempt (a second limiter slot when both are taken at once), and a
// "re-enqueued jobs whose task was missing" warning after every such retry.
func TestSweeper_ARescueTaskIsInPlace(t *testing.T) {
	t.Parallel()
	_, tb, sw, ids := sweepFixture(t, 1, 10)
	require.NoError(t, tb.enqueuer.EnqueueRescue(t.Context(), ids[0], ""))

	n, err := sw.SweepOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "the job's rescue task carries it")
	require.Zero(t, tb.state(t, ids[0]), "no second task")
	require.Equal(t, asynq.TaskStatePending, tb.state(t, ids[0]+":rescue"))

	// An archived rescue carries nothing, and an active one may be a dead worker's (the walk
	// recovers the job once its lease has run out): the job's own task is enqueued.
	for _, ended := range []func(id string){
		func(id string) { require.NoError(t, tb.inspector.ArchiveTask(tb.queue, id)) },
		func(id string) { orphan(t, redistest.Client(t), tb.queue, id) },
	} {
		for _, id := range []string{ids[0], ids[0] + ":rescue"} {
			if err := tb.inspector.DeleteTask(tb.queue, id); !errors.Is(err, asynq.ErrTaskNotFound) {
				require.NoError(t, err)
			}
		}
		require.NoError(t, tb.enqueuer.EnqueueRescue(t.Context(), ids[0], ""))
		ended(ids[0] + ":rescue")
		n, err = sw.SweepOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, asynq.TaskStatePending, tb.state(t, ids[0]))
	}
}
