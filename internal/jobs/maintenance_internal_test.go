package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
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

	// The retention pass's backlog probe (after each batch) reads one entry of the index, in the
	// pool's own settings.
	var plan string
	require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+oldestFinishedSQL, StatusSucceeded).Scan(&plan))
	require.Contains(t, plan, `"Index Name": "jobs_finished_idx"`)
	require.Contains(t, plan, `"Node Type": "Limit"`)
	require.NotContains(t, plan, `Bitmap`)
	require.NotContains(t, plan, `Seq Scan`)
}

// TestDeleteFinished_DeletesAttemptsAndEventsThroughTheirIndexes: a batch of the retention pass
// (and of ctl dead purge) deletes a few hundred jobs' attempts and events, which must be found
// through their primary keys (job_id first). Joined with the deleted jobs (job_id IN (SELECT
// ...)), the planner of a table never analyzed hashed the batch and read every attempt and every
// event in the database, once per batch: 0.43 s a batch at 200,000 jobs instead of 0.03 s,
// growing with the table, so a pass over a backlog slowed as the table grew.
func TestDeleteFinished_DeletesAttemptsAndEventsThroughTheirIndexes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	insertFinishedJobs(t, pool, StatusSucceeded)
	requireIndexedDeletes(t, pool, deleteFinishedSQL, StatusSucceeded, time.Now(), 500)
}

// TestPurgeDeadIDs_DeletesAttemptsAndEventsThroughTheirIndexes: the dead letters an operator
// purges by id (the console's selection, ctl dead purge ID...) have their attempts and events
// found by primary key too, not by reading both tables whole on a planner without statistics.
func TestPurgeDeadIDs_DeletesAttemptsAndEventsThroughTheirIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	insertFinishedJobs(t, pool, StatusDead)
	var ids []string // as many as the console's largest selection
	require.NoError(t, pool.QueryRow(ctx, `SELECT array_agg(id::text) FROM (SELECT id FROM jobs LIMIT 1000) j`).Scan(&ids))
	requireIndexedDeletes(t, pool, purgeDeadIDsSQL, ids)
}

// insertFinishedJobs fills the table with 20,000 jobs of a final status, ended a second apart,
// with an attempt and three events each, and no statistics (never analyzed).
func insertFinishedJobs(t *testing.T, pool *pgxpool.Pool, status Status) {
	t.Helper()
	ctx := context.Background()
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, finished_at, event_seq)
SELECT gen_random_uuid(), 'c', 'f', $1, '{}', 3, 60000, now() - g * interval '1 second',
	now() - g * interval '1 second', 3
FROM generate_series(1, 20000) g`, status)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, class)
SELECT id, 1, 'c', finished_at, 1, 'ok' FROM jobs`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO job_events (job_id, seq, type, payload)
SELECT id, n, 'queued', '{}' FROM jobs, generate_series(1, 3) n`)
	require.NoError(t, err)
}

// requireIndexedDeletes explains statement sql (in the deletions' transaction settings) and
// requires that it reads job_attempts and job_events through an index, never in full.
func requireIndexedDeletes(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	var plan []map[string]any
	require.NoError(t, NewStore(pool, nil).inOrderOfIndex(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) `+sql, args...).Scan(&plan)
	}))
	scans := map[string][]string{}
	var walk func(node map[string]any)
	walk = func(node map[string]any) {
		if rel, ok := node["Relation Name"].(string); ok && node["Node Type"] != "ModifyTable" {
			scans[rel] = append(scans[rel], node["Node Type"].(string))
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any))
		}
	}
	walk(plan[0]["Plan"].(map[string]any))
	for _, rel := range []string{"job_attempts", "job_events"} {
		require.NotEmpty(t, scans[rel], "%s is read", rel)
		require.NotContains(t, scans[rel], "Seq Scan", "%s is read through its primary key, not in full (%v)", rel, scans)
	}
}

// TestDeleteEndedBatches_PlansForItsCutoff: the retention pass's statement for ended provider
// batches is planned for its cutoff each time. As pgx's cached prepared statement it got a
// generic plan once the first five calls had deleted a backlog; that plan cannot know how few
// batches ended before the cutoff, and walked the primary key to read every batch's row, one
// buffer each (20,000 batches that ended within the day, none deletable yet: 20,000 buffers a
// call, where the plan for the cutoff reads the table's 285 pages).
func TestDeleteEndedBatches_PlansForItsCutoff(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := onePool(t, pgtest.Pool(t))
	const recent, old, limit = 5000, 3000, 500
	_, err := pool.Exec(ctx, `INSERT INTO provider_batches (id, credential, model, state, created_at, ended_at)
SELECT gen_random_uuid(), 'c', 'm', 'ended', now() - interval '2 days', CASE WHEN g <= $1 THEN now() - g * interval '1 second'
	ELSE now() - interval '2 days' END
FROM generate_series(1, $1::int + $2::int) g`, recent, old)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms, deadline, finished_at)
SELECT gen_random_uuid(), 'c', 'f', 'succeeded', '{}', 3, 60000, now(), now() FROM generate_series(1, 20000)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE provider_batches, jobs`)
	require.NoError(t, err)

	s := NewStore(pool, nil)
	before := time.Now().Add(-24 * time.Hour)
	deleted := int64(0)
	for range 10 { // past the calls Postgres plans anew before it may keep a generic plan
		n, err := s.DeleteEndedBatches(ctx, before, limit)
		require.NoError(t, err)
		deleted += n
	}
	require.Equal(t, int64(old), deleted)
	_, err = pool.Exec(ctx, `ANALYZE provider_batches`) // as autovacuum does, after the backlog's deletes
	require.NoError(t, err)

	const blocks = `SELECT heap_blks_read + heap_blks_hit + coalesce(idx_blks_read + idx_blks_hit, 0)
FROM pg_statio_user_tables WHERE relname = 'provider_batches'`
	at := statCount(t, pool, blocks)
	n, err := s.DeleteEndedBatches(ctx, before, limit)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Less(t, statCount(t, pool, blocks)-at, int64(recent/10), "read the recent batches' rows one by one")
}

// onePool returns a pool of one connection on pool's database, closed when the test ends: the
// statements it runs are prepared (or not) on the connection statCount reads and flushes the
// counts of.
func onePool(t *testing.T, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	cfg := pool.Config().Copy()
	cfg.MaxConns = 1
	one, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(one.Close)
	return one
}

// statCount flushes the statistics of pool's connection (a pool of one, onePool) and returns the
// count that query (one row, one integer, from the pg_stat or pg_statio views) reads.
func statCount(t *testing.T, pool *pgxpool.Pool, query string) int64 {
	t.Helper()
	_, err := pool.Exec(t.Context(), `SELECT pg_stat_force_next_flush()`) // flushed before the answer
	require.NoError(t, err)
	var n int64
	require.NoError(t, pool.QueryRow(t.Context(), query).Scan(&n))
	return n
}
