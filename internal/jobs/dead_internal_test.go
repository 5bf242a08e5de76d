package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestDead_StatementsReadTheirIndexes: the console's dead-letter page, ctl dead list and ctl dead
// retry select dead jobs among every job the table keeps (a few percent of millions), so each
// must find them through an index over the dead jobs, never read the whole table; and the
// console's overview counts the dead jobs by reason every 2 s from an index alone (migration
// 018), without reading every dead job's row. The table is analyzed and its visibility map set,
// as autovacuum leaves a table of finished jobs.
func TestDead_StatementsReadTheirIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, dead_reason, created_at, finished_at)
SELECT gen_random_uuid(), 'c' || g % 3, 'f', s, '{}', 3, 60000, now(),
	CASE WHEN s = 'dead' THEN (ARRAY['retries_exhausted', 'permanent_error'])[1 + g % 2] END,
	now() - g * interval '1 second', now() - g * interval '1 second' + interval '5 seconds'
FROM generate_series(1, 20000) g, LATERAL (SELECT CASE WHEN g % 50 = 0 THEN 'dead' ELSE 'succeeded' END AS s) st`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE jobs`)
	require.NoError(t, err)

	explain := func(sql string, args ...any) string {
		t.Helper()
		var plan string
		require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+sql, args...).Scan(&plan))
		return plan
	}
	for name, f := range map[string]DeadFilter{
		"All":        {Limit: 50},
		"Reason":     {Reason: ReasonRetriesExhausted, Limit: 50},
		"Credential": {Credential: "c1", Limit: 50},
		"Before":     {Before: time.Now(), Limit: 50},
	} {
		sql, args := listDeadQuery(f)
		plan := explain(sql, args...)
		require.NotContains(t, plan, `"Node Type": "Seq Scan"`, "ListDead %s reads the whole table", name)

		sql, args = retryDeadQuery(f, time.Now(), retryDeadBatch)
		plan = explain(sql, args...)
		require.NotContains(t, plan, `"Node Type": "Seq Scan"`, "RetryDead %s reads the whole table", name)
	}

	plan := explain(deadByReasonSQL)
	require.Contains(t, plan, `"Node Type": "Index Only Scan"`, "DeadByReason reads every dead job's row")
	require.Contains(t, plan, `"Index Name": "jobs_dead_reason_idx"`)
}
