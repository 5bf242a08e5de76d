package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The retention scenario's table of finished jobs is written straight into the run's database,
// a chunk per statement, not through the API: a million jobs through the API would take longer
// than every drain together. Each job copies the request, answer and usage of a real job (a
// warm-up job), so that its rows are as wide as llmq's; the rest follows llmq's statements: the
// events a job's transitions append, one attempt row per provider call, and a key in
// idempotency_keys besides the job's idempotency_key column.
//
// The mix, per 100 jobs (i % 100):
//
//	0–84   succeeded at the first attempt       1 attempt  3 events (queued, running, succeeded)
//	85–92  succeeded after a 529                2 attempts 5 events (…, retrying, running, succeeded)
//	93–95  failed on a 400                      1 attempt  3 events
//	96–97  dead, retries exhausted (three 529s) 3 attempts 7 events
//	98–99  canceled while queued                0 attempts 2 events (queued, canceled)
//
// and 3 jobs in 10 (i % 10 < 3) were submitted with an idempotency key: per job 1.10 attempts,
// 3.22 events and 0.3 keys, 5.62 rows with the job's own. Every job finished past its status's
// default retention: the others 8 to 38 days ago, dead letters 31 to 61 days ago, spread evenly
// by i over the table's size, the oldest first in the heap.

// Fixture ratios, per job, for the notes; TestFixture checks them against the
// statement's mix.
const (
	fixtureAttemptsPerJob = 1.10
	fixtureEventsPerJob   = 3.22
	fixtureKeysPerJob     = 0.30
)

// fixtureChunk is how many jobs one statement of the fill inserts.
const fixtureChunk = 100_000

// fixtureTenant is the tenant of every job: the anonymous tenant the drained jobs are
// submitted as.
const fixtureTenant = "default"

// fixtureSQL inserts jobs $1 ≤ i < $2 of a table of $3 for tenant $4, copying job $5, and
// answers with the rows it inserted per table. Jobs, attempts and events go in one statement; the keys' foreign key is checked at
// commit (it is deferred), when the jobs are there.
const fixtureSQL = `
WITH t AS (
	SELECT credential, fingerprint, request, result, usage, metadata, max_attempts, timeout_ms
	FROM jobs WHERE id = $5
), g AS (
	SELECT i, i % 100 AS m,
		now() - interval '38 days' + (i % $3::bigint) * (interval '30 days' / $3::bigint) AS fin
	FROM generate_series($1::bigint, $2::bigint - 1) i
), s AS (
	SELECT i,
		CASE WHEN m < 93 THEN 'succeeded' WHEN m < 96 THEN 'failed' WHEN m < 98 THEN 'dead' ELSE 'canceled' END AS status,
		CASE WHEN m < 85 THEN 1 WHEN m < 93 THEN 2 WHEN m < 96 THEN 1 WHEN m < 98 THEN 3 ELSE 0 END AS attempts,
		CASE WHEN m BETWEEN 96 AND 97 THEN fin - interval '23 days' ELSE fin END AS fin
	FROM g
), j AS (
	INSERT INTO jobs (id, tenant, credential, idempotency_key, fingerprint, status, request, attempts, max_attempts,
		timeout_ms, deadline, metadata, result, usage, last_error, dead_reason, event_seq, created_at, started_at,
		finished_at, updated_at, answered_by)
	SELECT gen_random_uuid(), $4, t.credential, CASE WHEN s.i % 10 < 3 THEN 'fixture-' || s.i END, t.fingerprint,
		s.status, t.request, s.attempts, t.max_attempts, t.timeout_ms,
		s.fin - interval '10 seconds' + t.timeout_ms * interval '1 millisecond', t.metadata,
		CASE WHEN s.status = 'succeeded' THEN t.result END,
		CASE WHEN s.status = 'succeeded' THEN t.usage END,
		CASE WHEN s.status = 'failed' THEN
				'{"class":"permanent","status":400,"type":"invalid_request_error","message":"max_tokens: 64000 > 8192, the maximum allowed"}'::jsonb
			WHEN s.attempts > 1 THEN '{"class":"retryable","status":529,"type":"overloaded_error","message":"Overloaded"}'::jsonb END,
		CASE WHEN s.status = 'dead' THEN 'retries_exhausted' END,
		CASE WHEN s.attempts = 0 THEN 2 ELSE 2 * s.attempts + 1 END,
		s.fin - interval '10 seconds', CASE WHEN s.attempts > 0 THEN s.fin - interval '9 seconds' END, s.fin, s.fin,
		CASE WHEN s.status = 'succeeded' THEN t.credential END
	FROM s, t
	RETURNING id, tenant, credential, idempotency_key, fingerprint, status, attempts, event_seq, created_at
), a AS (
	INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, ttfb_ms, status_code, class, delay_ms, error)
	SELECT j.id, n, j.credential, j.created_at + interval '1 second' + (n - 1) * interval '3 seconds',
		800 + 1500 * random(), 300 + 200 * random(),
		CASE WHEN n < j.attempts OR j.status = 'dead' THEN 529 WHEN j.status = 'failed' THEN 400 ELSE 200 END,
		CASE WHEN n < j.attempts OR j.status = 'dead' THEN 'retryable' WHEN j.status = 'failed' THEN 'permanent' ELSE 'ok' END,
		CASE WHEN n < j.attempts THEN 1000 END,
		CASE WHEN n < j.attempts OR j.status = 'dead' THEN 'overloaded_error: Overloaded'
			WHEN j.status = 'failed' THEN 'invalid_request_error: max_tokens: 64000 > 8192, the maximum allowed' END
	FROM j, generate_series(1, j.attempts) n
	RETURNING 1
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload, created_at)
	SELECT j.id, q,
		CASE WHEN q = 1 THEN 'queued' WHEN q = j.event_seq THEN j.status WHEN q % 2 = 0 THEN 'running' ELSE 'retrying' END,
		CASE WHEN q = j.event_seq AND j.status = 'dead' THEN '{"reason":"retries_exhausted"}'::jsonb
			WHEN q % 2 = 0 AND q < j.event_seq THEN jsonb_build_object('attempt', q / 2) ELSE '{}'::jsonb END,
		j.created_at + (q - 1) * interval '1 second'
	FROM j, generate_series(1, j.event_seq) q
	RETURNING 1
), k AS (
	INSERT INTO idempotency_keys (tenant, key, fingerprint, job_id, created_at)
	SELECT tenant, idempotency_key, fingerprint, id, created_at FROM j WHERE idempotency_key IS NOT NULL
	RETURNING 1
)
SELECT (SELECT count(*) FROM j), (SELECT count(*) FROM a), (SELECT count(*) FROM e), (SELECT count(*) FROM k)`

// fixtureRows counts the rows a fill inserted, per table.
type fixtureRows struct{ jobs, attempts, events, keys int64 }

func (r fixtureRows) add(o fixtureRows) fixtureRows {
	return fixtureRows{r.jobs + o.jobs, r.attempts + o.attempts, r.events + o.events, r.keys + o.keys}
}

// total is every row.
func (r fixtureRows) total() int64 { return r.jobs + r.attempts + r.events + r.keys }

// fixture is the table of expired finished jobs of one run's database.
type fixture struct {
	pool *pgxpool.Pool
	// template is the succeeded job whose request, answer and usage every job copies.
	template string
	size     int // the table's size: what each top-up restores
	next     int // the index of the next job inserted (keys stay unique across top-ups)
}

// insert inserts n jobs in chunks of fixtureChunk, logging each chunk when log is set.
func (f *fixture) insert(ctx context.Context, n int, log logf) (fixtureRows, error) {
	var all fixtureRows
	for done := 0; done < n; {
		k := min(fixtureChunk, n-done)
		var r fixtureRows
		err := f.pool.QueryRow(ctx, fixtureSQL, f.next, f.next+k, f.size, fixtureTenant, f.template).Scan(&r.jobs, &r.attempts, &r.events, &r.keys)
		if err != nil {
			return all, fmt.Errorf("insert finished jobs: %w", err)
		}
		if r.jobs != int64(k) {
			return all, fmt.Errorf("insert finished jobs: %d of %d inserted (the job to copy is gone?)", r.jobs, k)
		}
		f.next += k
		done += k
		all = all.add(r)
		if log != nil {
			log("  %s/%s finished jobs inserted", thousands(done), thousands(n))
		}
	}
	return all, nil
}

// count returns how many of the fixture's jobs are left: the jobs created more than a day ago
// (the fixture's are 8 days old or more; the bench's own jobs are created during the run), an
// index-only scan of jobs_tenant_created_idx once the table is vacuumed.
func (f *fixture) count(ctx context.Context) (int, error) {
	var n int
	err := f.pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE tenant = $1 AND created_at < now() - interval '1 day'`,
		fixtureTenant).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count finished jobs: %w", err)
	}
	return n, nil
}

// topUp inserts the jobs the deleter took, so that the table holds size expired jobs again,
// and returns how many it inserted.
func (f *fixture) topUp(ctx context.Context) (int, error) {
	n, err := f.count(ctx)
	if err != nil || n >= f.size {
		return 0, err
	}
	if _, err := f.insert(ctx, f.size-n, nil); err != nil {
		return 0, err
	}
	return f.size - n, nil
}

// retentionTables are the tables a deleted job's rows are in.
var retentionTables = []string{"jobs", "job_attempts", "job_events", "job_watches", "idempotency_keys"}

// vacuum runs VACUUM (ANALYZE) on the tables: the deleted rows of a run are not left for the
// next one (or for autovacuum during it), and the planner knows the table's size.
func (f *fixture) vacuum(ctx context.Context) error {
	for _, t := range retentionTables {
		if _, err := f.pool.Exec(ctx, "VACUUM (ANALYZE) "+t); err != nil {
			return fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	return nil
}

// deletions are the rows deleted from the tables since the server's statistics were reset,
// as its statistics have them (a backend reports its counts when it goes idle, at most once a
// second while busy, so a reading lags by up to a second).
type deletions struct {
	at         time.Time
	jobs, rows int64
}

// readDeletions reads the deletions counted so far.
func readDeletions(ctx context.Context, pool *pgxpool.Pool) (deletions, error) {
	d := deletions{at: time.Now()}
	err := pool.QueryRow(ctx, `SELECT coalesce(sum(n_tup_del) FILTER (WHERE relname = 'jobs'), 0), coalesce(sum(n_tup_del), 0)
FROM pg_stat_user_tables WHERE relname = ANY($1)`, retentionTables).Scan(&d.jobs, &d.rows)
	if err != nil {
		return d, fmt.Errorf("read deletions: %w", err)
	}
	return d, nil
}
