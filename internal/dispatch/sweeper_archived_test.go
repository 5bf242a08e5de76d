package dispatch_test

import (
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"
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
