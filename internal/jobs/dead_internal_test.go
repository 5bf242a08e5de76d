package jobs

import (
	"context"
	"slices"
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
	// 2,000 tenants, a tenth of them revoked, whose dead letters RetryDead skips.
	_, err = pool.Exec(ctx, `INSERT INTO tenants (name, token_sha256, revoked_at)
SELECT 't' || g, sha256(('t' || g)::bytea), CASE WHEN g % 10 = 0 THEN now() END FROM generate_series(1, 2000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE jobs SET tenant = 't' || (1 + abs(hashtext(id::text)) % 2000)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE tenants`)
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
		sql, args, err := pageDeadQuery(f, "")
		require.NoError(t, err)
		plan := explain(sql, args...)
		require.NotContains(t, plan, `"Node Type": "Seq Scan"`, "PageDead %s reads the whole table", name)
		sql, args, err = pageDeadQuery(f, encodeCursor(time.Now(), "01a249a3-d2aa-714b-936c-2be8ea642679"))
		require.NoError(t, err)
		plan = explain(sql, args...)
		require.NotContains(t, plan, `"Node Type": "Seq Scan"`, "PageDead %s, a later page, reads the whole table", name)

		sql, args = retryDeadQuery(f, time.Now(), nil, retryDeadBatch)
		plan = explain(sql, args...)
		// The tenants table, one row a tenant, it may read whole (the revoked, into a hash) when
		// that is cheaper than a look-up by primary key for each dead job (a few dead jobs).
		require.Empty(t, slices.DeleteFunc(seqScans(t, plan), func(rel string) bool { return rel == "tenants" }),
			"RetryDead %s reads the whole table", name)
		sql, args = retryDeadQuery(f, time.Now(), &deadKey{time.Now().Add(-time.Hour), "01a249a3-d2aa-714b-936c-2be8ea642679"}, retryDeadBatch)
		plan = explain(sql, args...)
		require.Empty(t, slices.DeleteFunc(seqScans(t, plan), func(rel string) bool { return rel == "tenants" }),
			"RetryDead %s, a later batch, reads the whole table", name)
	}

	plan := explain(deadByReasonSQL)
	require.Contains(t, plan, `"Node Type": "Index Only Scan"`, "DeadByReason reads every dead job's row")
	require.Contains(t, plan, `"Index Name": "jobs_dead_reason_idx"`)
}

// seqScans returns the relation of each sequential scan in an EXPLAIN (FORMAT JSON) plan.
func seqScans(t *testing.T, plan string) []string {
	t.Helper()
	var out []string
	walkPlan(t, plan, func(n planNode, _ string) {
		if n.Type == "Seq Scan" {
			out = append(out, n.Relation)
		}
	})
	return out
}
