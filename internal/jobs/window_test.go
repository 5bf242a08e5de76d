package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_StatsWindowEndsOnPostgresClock: the window is measured back from Postgres's now(),
// which wrote the times it compares (TestOverview_WindowIsOnPostgresClock in internal/console
// runs it on a host whose clock is off).
func TestStore_StatsWindowEndsOnPostgresClock(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	in := b.Finished(t, jobs.StatusSucceeded, "")
	b.FinishedAgo(t, in, 50*time.Minute)
	out := b.Finished(t, jobs.StatusSucceeded, "")
	b.FinishedAgo(t, out, 70*time.Minute)

	var before, after time.Time
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT now()`).Scan(&before))
	st, err := b.Store.Stats(ctx, time.Hour)
	require.NoError(t, err)
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT now()`).Scan(&after))

	require.Equal(t, 1, st.ByStatus[jobs.StatusSucceeded])
	require.Equal(t, 1, st.Succeeded)
	require.False(t, st.Since.Before(before.Add(-time.Hour)), "since %s, Postgres's clock read %s before", st.Since, before)
	require.False(t, st.Since.After(after.Add(-time.Hour)), "since %s, Postgres's clock read %s after", st.Since, after)
}
