package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestCancelPageSQL_ReadsItsPageOnce: a page's statement reads its page (the CTE cand) for the
// locks and the answer, never once for each row it answers: a subquery on cand for each job
// answered (its walk key) read the page's 500 rows 500 times (140 ms a page of 500, 119 joined).
// Both walks' statements, as planned on an empty table.
func TestCancelPageSQL_ReadsItsPageOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	for name, sql := range map[string]string{"unfinished": cancelUnfinishedPageSQL, "dead": cancelDeadPageSQL} {
		var plan string
		require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+sql, "acme", time.Time{}, uuid.Nil.String(), cancelPageSize).Scan(&plan))
		require.Empty(t, cteScansPerRow(t, plan, "cand"), "%s: %s", name, plan)
	}
}

// TestCancelPageSQL_ReadsItsCancelsOnce: a page's answer lists the page's jobs it did not
// cancel by leaving out those it did (the CTE c), reading c once for the page, not once for each
// of the page's jobs: anti-joined with NOT EXISTS, a planner that expects one canceled job
// rescanned c for each row of the page, 125,000 rows read for a page of 500 (27 ms of its 72 on a
// table of 600,000 jobs). Both walks' statements on a full page, the table never analyzed.
func TestCancelPageSQL_ReadsItsCancelsOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, tenant, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, finished_at)
SELECT gen_random_uuid(), 'acme', 'c', 'f', s, '{}', 3, 60000, now() + g * interval '1 second',
	CASE WHEN s = 'dead' THEN now() - g * interval '1 second' END
FROM generate_series(1, $1::int) g, unnest(ARRAY['dead', 'queued']) s`, cancelPageSize)
	require.NoError(t, err)
	for name, sql := range map[string]string{"unfinished": cancelUnfinishedPageSQL, "dead": cancelDeadPageSQL} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, noSortSettings) // as the unfinished walk runs (inOrderOfIndex)
		require.NoError(t, err)
		var plan string
		err = tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, "acme", time.Time{}, uuid.Nil.String(), cancelPageSize).Scan(&plan)
		require.NoError(t, tx.Rollback(ctx))
		require.NoError(t, err)
		// c is read by the answer's join, the events' insert and the left-out filter: once each.
		require.LessOrEqual(t, cteRowsRead(t, plan, "c"), 3*cancelPageSize, name)
	}
}

// cteRowsRead returns how many rows the scans of the CTE cte returned in all, each scan's rows
// times its loops, in an EXPLAIN (ANALYZE, FORMAT JSON) plan.
func cteRowsRead(t *testing.T, plan, cte string) int {
	t.Helper()
	var rows float64
	walkPlan(t, plan, func(n planNode, _ string) {
		if n.CTE == cte {
			rows += n.Rows * n.Loops
		}
	})
	return int(rows)
}

// cteScansPerRow returns the subplans (run again for each outer row: "SubPlan", not "InitPlan")
// that scan the CTE cte, by name, in an EXPLAIN (FORMAT JSON) plan.
func cteScansPerRow(t *testing.T, plan, cte string) []string {
	t.Helper()
	var out []string
	walkPlan(t, plan, func(n planNode, subplan string) {
		if subplan != "" && n.CTE == cte {
			out = append(out, subplan)
		}
	})
	return out
}

// planNode is a node of an EXPLAIN (FORMAT JSON) plan, the fields the tests read (Rows and
// Loops with ANALYZE only).
type planNode struct {
	Type     string     `json:"Node Type"`
	Relation string     `json:"Relation Name"`
	Index    string     `json:"Index Name"`
	Cond     string     `json:"Index Cond"`
	Filter   string     `json:"Filter"`
	Parent   string     `json:"Parent Relationship"`
	Subplan  string     `json:"Subplan Name"`
	CTE      string     `json:"CTE Name"`
	Rows     float64    `json:"Actual Rows"`
	Loops    float64    `json:"Actual Loops"`
	Plans    []planNode `json:"Plans"`
}

// walkPlan calls visit with every node of the EXPLAIN (FORMAT JSON) plan, parents first, and the
// name of the innermost subplan run for each outer row ("SubPlan", not "InitPlan") the node is
// in, or "" when it is in none.
func walkPlan(t *testing.T, plan string, visit func(n planNode, subplan string)) {
	t.Helper()
	var top []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal([]byte(plan), &top))
	var walk func(n planNode, subplan string)
	walk = func(n planNode, subplan string) {
		if n.Parent == "SubPlan" {
			subplan = n.Subplan
		}
		visit(n, subplan)
		for _, c := range n.Plans {
			walk(c, subplan)
		}
	}
	for _, p := range top {
		walk(p.Plan, "")
	}
}

// TestAbortInFlightOfTenant_ReadsTheLatestCanceledOnly: the abort of a tenant's canceled jobs in
// flight, which each offboarding run makes first, reads the jobs canceled lately
// (jobs_finished_idx), not every job the tenant ever had: through jobs_tenant_created_idx a
// tenant of a million jobs cost 1.7 to 2.5 s a run. The table is not analyzed.
func TestAbortInFlightOfTenant_ReadsTheLatestCanceledOnly(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, tenant, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, created_at, finished_at)
SELECT gen_random_uuid(), 'big', 'c', 'f', 'succeeded', '{}', 3, 60000, now(), now() - g * interval '1 second',
	now() - g * interval '1 second'
FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	var plan string
	require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+abortInFlightOfTenantSQL, "big").Scan(&plan))
	require.Contains(t, plan, `"Index Name": "jobs_finished_idx"`)
	require.NotContains(t, plan, `"Rows Removed by Filter": 20000`, "read the tenant's every job")
	require.Empty(t, seqScans(t, plan))
}
