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

// cteScansPerRow returns the subplans (run again for each outer row: "SubPlan", not "InitPlan")
// that scan the CTE cte, by name, in an EXPLAIN (FORMAT JSON) plan.
func cteScansPerRow(t *testing.T, plan, cte string) []string {
	t.Helper()
	type node struct {
		Parent  string `json:"Parent Relationship"`
		Subplan string `json:"Subplan Name"`
		CTE     string `json:"CTE Name"`
		Plans   []node `json:"Plans"`
	}
	var top []struct {
		Plan node `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal([]byte(plan), &top))
	var out []string
	var walk func(n node, in string)
	walk = func(n node, in string) {
		if n.Parent == "SubPlan" {
			in = n.Subplan
		}
		if in != "" && n.CTE == cte {
			out = append(out, in)
		}
		for _, c := range n.Plans {
			walk(c, in)
		}
	}
	walk(top[0].Plan, "")
	return out
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
