package backlog

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestGauge_StatementReadsItsIndex: the measurement counts the waiting jobs and finds the oldest
// among every job the table keeps (millions, mostly finished) every 15 s, so it reads
// jobs_online_waiting_idx alone (an index-only scan), never the table nor the waiting jobs' rows.
// The table is analyzed and its visibility map set, as autovacuum leaves it.
func TestGauge_StatementReadsItsIndex(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, created_at, finished_at, lane)
SELECT gen_random_uuid(), 'c' || g % 3, 'f', s, '{}', 3, 60000, now(), now() - g * interval '1 second',
	CASE WHEN s = 'succeeded' THEN now() END, CASE WHEN g % 7 = 0 THEN 'batch' ELSE 'online' END
FROM generate_series(1, 20000) g, LATERAL (SELECT CASE g % 100 WHEN 0 THEN 'queued' WHEN 1 THEN 'retrying'
	WHEN 2 THEN 'running' ELSE 'succeeded' END AS s) st`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `VACUUM ANALYZE jobs`)
	require.NoError(t, err)

	var plan string
	require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+waitingSQL).Scan(&plan))
	require.NotContains(t, plan, `"Node Type": "Seq Scan"`)
	require.Contains(t, plan, `"Node Type": "Index Only Scan"`, "reads every waiting job's row")
	require.Contains(t, plan, `"Index Name": "jobs_online_waiting_idx"`)
}
