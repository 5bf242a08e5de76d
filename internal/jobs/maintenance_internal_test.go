package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestMaintenance_StatementsReadTheirIndexes: the deadline pass runs every second and the
// retention pass walks a table of millions of finished jobs, so each must find its rows through
// its index (migration 012) in order and stop at its limit, never read and sort the table. The
// table is never analyzed, as on a fresh database or with autovacuum off: the planner's worst case.
func TestMaintenance_StatementsReadTheirIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, finished_at)
SELECT gen_random_uuid(), 'c', 'f', s, '{}', 3, 60000, now() - g * interval '1 second',
	CASE WHEN s <> 'queued' THEN now() - g * interval '1 second' END
FROM generate_series(1, 5000) g, LATERAL (SELECT (ARRAY['queued', 'succeeded', 'failed', 'dead', 'canceled'])[1 + g % 5] AS s) st`)
	require.NoError(t, err)

	for _, c := range []struct {
		sql   string
		args  []any
		index string
	}{
		{failOverdueSQL, []any{time.Now(), 100, ReasonDeadlineExceeded}, "jobs_unfinished_deadline_idx"},
		{deleteFinishedSQL, []any{StatusSucceeded, time.Now(), 500}, "jobs_finished_idx"},
	} {
		var plan string
		require.NoError(t, NewStore(pool, nil).inOrderOfIndex(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+c.sql, c.args...).Scan(&plan)
		}))
		require.Contains(t, plan, `"Index Name": "`+c.index+`"`)
		require.NotContains(t, plan, `"Node Type": "Sort"`)
	}
}
