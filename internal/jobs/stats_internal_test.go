package jobs

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestStats_ReadsTheSuccessesOnce: the stats statement scans the window's successes once, for
// their count and their percentiles; Stats puts that count among the counts by status. Counted
// among the final statuses too, they were a second scan of jobs_finished_idx over the same rows,
// 40% of the statement's buffers and 10-20% of its time at 211,000 successes in the window.
func TestStats_ReadsTheSuccessesOnce(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var plan string
	require.NoError(t, pool.QueryRow(t.Context(), `EXPLAIN (FORMAT JSON) `+statsSQL, time.Hour.Microseconds()).Scan(&plan))
	var scans []string
	walkPlan(t, plan, func(n planNode, _ string) {
		if n.Relation != "jobs" && n.Index == "" { // not a read of the table or one of its indexes
			return
		}
		for _, cond := range []string{n.Cond, n.Filter} {
			if strings.Contains(cond, "succeeded") {
				scans = append(scans, n.Type+" "+n.Index+": "+cond)
			}
		}
	})
	require.Len(t, scans, 1, "the scans of the successes: %q", scans)
}
