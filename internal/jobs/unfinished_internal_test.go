package jobs

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestListUnfinished_PageReadsTheIndexInOrder: a page of ListUnfinished must be an index scan
// that stops after its rows, never a sort of every unfinished job (which made a sweep cost the
// square of the backlog). The table is never analyzed, as on a fresh database or with autovacuum
// off: the planner's worst case.
func TestListUnfinished_PageReadsTheIndexInOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms, deadline)
SELECT gen_random_uuid(), 'c', 'f', CASE WHEN g % 3 = 0 THEN 'succeeded' ELSE 'queued' END, '{}', 3, 60000, now() + interval '1 hour'
FROM generate_series(1, 5000) g`)
	require.NoError(t, err)

	var plan string
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, noSortSettings); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+listUnfinishedSQL, uuid.Nil.String(), 500).Scan(&plan)
	}))
	require.Contains(t, plan, `"Index Name": "jobs_unfinished_online_idx"`)
	require.NotContains(t, plan, `"Node Type": "Sort"`)

	// And the pages walk every unfinished job once, in ID order.
	s := NewStore(pool, nil)
	var seen []string
	after := ""
	for {
		page, err := s.ListUnfinished(ctx, after, 500)
		require.NoError(t, err)
		for _, u := range page {
			seen = append(seen, u.ID)
			after = u.ID
		}
		if len(page) < 500 {
			break
		}
	}
	var want []string
	rows, err := pool.Query(ctx, `SELECT id::text FROM jobs WHERE status = 'queued' ORDER BY jobs.id`)
	require.NoError(t, err)
	want, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, want, seen)
}

// TestListUnfinished_PageSkipsTheBatchLane: the batch lane's jobs wait for their batch in the
// unfinished statuses for hours (a provider's batch takes up to a day) and in the hundreds of
// thousands, and ListUnfinished leaves them out. A page must not read them to leave them out:
// the sweeper's pass, every 10 s, would otherwise read the whole batch backlog, row by row,
// however few online jobs it checks. The page's index holds the online lane's jobs only
// (migration 019), so the scan reads its 500 rows and no other.
func TestListUnfinished_PageSkipsTheBatchLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms, deadline, lane)
SELECT gen_random_uuid(), 'c', 'f', CASE WHEN g % 2 = 0 THEN 'running' ELSE 'queued' END, '{}', 3, 60000, now() + interval '1 hour',
	CASE WHEN g % 10 = 0 THEN 'online' ELSE 'batch' END
FROM generate_series(1, 10000) g`)
	require.NoError(t, err)

	var raw []byte
	require.NoError(t, NewStore(pool, nil).inOrderOfIndex(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+listUnfinishedSQL, uuid.Nil.String(), 500).Scan(&raw)
	}))
	var out []struct {
		Plan struct {
			Plans []struct {
				IndexName    string  `json:"Index Name"`
				ActualRows   float64 `json:"Actual Rows"`
				RowsFiltered float64 `json:"Rows Removed by Filter"`
			} `json:"Plans"`
		} `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &out))
	scan := out[0].Plan.Plans[0]
	require.Equal(t, float64(500), scan.ActualRows, string(raw))
	require.Zero(t, scan.RowsFiltered, "a page of 500 online jobs read %v batch-lane jobs to leave them out", scan.RowsFiltered)
}

// TestCancelTenant_WalkReadsEachJobOnce: `ctl tenants revoke --cancel-jobs` walks the
// tenant's unfinished jobs page by page (cancelUnfinishedCandSQL, the page of CancelTenant's
// statement), canceling each page before it reads the next. The walk must read each unfinished
// job once: a page that starts again from the top reads every job the pages before canceled (a
// backlog of N jobs costs N²/1000 rows) and, through the tenant's index, every job the tenant
// ever had. The table is never analyzed (the planner's worst case).
func TestCancelTenant_WalkReadsEachJobOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, tenant, credential, fingerprint, status, request, max_attempts, timeout_ms, deadline, created_at, lane)
SELECT gen_random_uuid(), CASE WHEN g % 4 = 0 THEN 'other' ELSE 'acme' END, 'c', 'f',
	CASE WHEN g % 3 = 0 THEN 'succeeded' WHEN g % 3 = 1 THEN 'queued' ELSE 'running' END, '{}', 3, 60000,
	now() + (g % 50) * interval '1 minute', now() - g * interval '1 second', CASE WHEN g % 5 = 0 THEN 'batch' ELSE 'online' END
FROM generate_series(1, 6000) g`)
	require.NoError(t, err)
	var want []string
	rows, err := pool.Query(ctx, `SELECT id::text FROM jobs WHERE tenant = 'acme' AND status <> 'succeeded'`)
	require.NoError(t, err)
	want, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)

	s := NewStore(pool, nil)
	var seen []string
	at, after := time.Time{}, uuid.Nil.String()
	read := 0
	for {
		read += rowsRead(t, s, at, after)
		var ids []string
		require.NoError(t, s.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
			rows, err := tx.Query(ctx, `SELECT k_id::text, k_at FROM (`+cancelUnfinishedCandSQL+`) p`, "acme", at, after, 500)
			if err != nil {
				return err
			}
			ids, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
				err := r.Scan(&after, &at)
				return after, err
			})
			return err
		}))
		seen = append(seen, ids...)
		_, err = pool.Exec(ctx, `UPDATE jobs SET status = 'canceled' WHERE id = ANY($1::uuid[])`, ids)
		require.NoError(t, err)
		if len(ids) < 500 {
			break
		}
	}
	require.ElementsMatch(t, want, seen)
	// 4,000 unfinished jobs, the other tenant's 1,000 among them, and the ties of each page's last
	// deadline (an incremental sort orders them by ID).
	require.LessOrEqual(t, read, 5000, "the walk of %d jobs read %d rows", len(want), read)
}

// rowsRead is how many rows the page of CancelTenant after the key (at, after) reads.
func rowsRead(t *testing.T, s *Store, at time.Time, after string) int {
	t.Helper()
	var raw []byte
	require.NoError(t, s.inOrderOfIndex(context.Background(), func(tx pgx.Tx) error {
		return tx.QueryRow(context.Background(), `EXPLAIN (ANALYZE, FORMAT JSON) `+cancelUnfinishedCandSQL,
			"acme", at, after, 500).Scan(&raw)
	}))
	type node struct {
		NodeType string  `json:"Node Type"`
		Rows     float64 `json:"Actual Rows"`
		Loops    float64 `json:"Actual Loops"`
		Filtered float64 `json:"Rows Removed by Filter"`
		Recheck  float64 `json:"Rows Removed by Index Recheck"`
		Plans    []node  `json:"Plans"`
	}
	var out []struct {
		Plan node `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(raw, &out))
	var sum func(n node) float64
	sum = func(n node) float64 {
		total := 0.0
		if strings.HasSuffix(n.NodeType, "Scan") && n.NodeType != "Bitmap Index Scan" {
			total += (n.Rows + n.Filtered + n.Recheck) * max(n.Loops, 1)
		}
		for _, c := range n.Plans {
			total += sum(c)
		}
		return total
	}
	return int(sum(out[0].Plan))
}
