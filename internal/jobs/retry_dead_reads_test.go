package jobs_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_RetryDeadReadsSkippedOnce: a retry of all the dead letters reads the dead letters it
// skips (a revoked tenant's) once, not once a batch. Each batch started again at the oldest
// matching death and read every skipped one before it: 100,000 revoked dead letters and 100,000
// to retry were 200 batches of 100,000 rows read each. The rows read are counted in the plans of
// the statements RetryDead ran (auto_explain, ANALYZE), not timed.
//
// So too when the tenants table was never analyzed (autovacuum analyzes it only once 50 of its
// rows have changed: a deployment of a few tenants may never have its statistics): the planner, taking it for hundreds of
// rows, hashed it and joined every dead letter after the cursor to it before sorting them, and
// each batch read all those the batches after it would retry.
func TestStore_RetryDeadReadsSkippedOnce(t *testing.T) {
	t.Parallel()
	for name, analyzed := range map[string]bool{"TenantsAnalyzed": true, "TenantsNeverAnalyzed": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testRetryDeadReadsSkippedOnce(t, analyzed)
		})
	}
}

func testRetryDeadReadsSkippedOnce(t *testing.T, analyzeTenants bool) {
	b := jobstest.New(t)
	ctx := t.Context()
	// Given 1,000 dead letters of a revoked tenant, the oldest deaths, and 1,000 to retry after
	// them.
	const skipped, toRetry, batch = 1000, 1000, 50
	_, err := b.Pool.Exec(ctx, `INSERT INTO tenants (name, token_sha256, revoked_at) VALUES ('gone', sha256('gone'), now())`)
	require.NoError(t, err)
	rows, err := b.Pool.Query(ctx, `INSERT INTO jobs (id, tenant, credential, fingerprint, status, request, max_attempts,
	timeout_ms, deadline, dead_reason, finished_at)
SELECT gen_random_uuid(), CASE WHEN g <= $1::int THEN 'gone' ELSE 'default' END, 'default', 'f', 'dead', '{}', 3, 60000, now(),
	'retries_exhausted', now() - interval '1 day' + g * interval '1 second'
FROM generate_series(1, $1::int + $2::int) g RETURNING id::text, tenant`, skipped, toRetry)
	require.NoError(t, err)
	var want []string
	var id, tenant string
	_, err = pgx.ForEachRow(rows, []any{&id, &tenant}, func() error {
		if tenant == "default" {
			want = append(want, id)
		}
		return nil
	})
	require.NoError(t, err)
	// Among many more jobs that are not dead, as in a table that keeps every finished job.
	_, err = b.Pool.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, finished_at)
SELECT gen_random_uuid(), 'default', 'f', 'succeeded', '{}', 3, 60000, now(), now() - interval '1 day' + g * interval '100 ms'
FROM generate_series(1, 20000) g`)
	require.NoError(t, err)
	if analyzeTenants {
		_, err = b.Pool.Exec(ctx, `VACUUM ANALYZE tenants`)
		require.NoError(t, err)
	} else {
		var tuples float64
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT reltuples FROM pg_class WHERE oid = 'tenants'::regclass`).Scan(&tuples))
		require.Negative(t, tuples, "tenants was analyzed or vacuumed")
	}
	_, err = b.Pool.Exec(ctx, `VACUUM ANALYZE jobs`)
	require.NoError(t, err)

	// When they are retried by a store whose every statement's plan is counted
	plans := explainedPool(t, b.URL)
	got, err := jobs.NewStore(plans.pool, nil).RetryDead(ctx, jobs.DeadFilter{}, &jobs.RetryDeadOpts{Batch: batch})
	require.NoError(t, err)
	require.ElementsMatch(t, want, unfinishedIDs(got))

	// Then the jobs table's rows were read about once each: 2,000, and a few more at each
	// batch's edges (not 21 batches × 1,000 skipped)
	read := plans.rowsRead(t, "jobs")
	require.LessOrEqual(t, read, 2*(skipped+toRetry), "rows of jobs read by RetryDead's %d batches", (toRetry+batch-1)/batch)
}

// explained is a pool whose connections send the plan of each statement they run (auto_explain,
// with ANALYZE) to the client as a notice, which it keeps.
type explained struct {
	pool  *pgxpool.Pool
	mu    sync.Mutex
	plans []string
}

// explainedPool opens an explained pool on the database at url, closed when the test ends.
func explainedPool(t *testing.T, url string) *explained {
	t.Helper()
	e := &explained{}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if _, plan, ok := strings.Cut(n.Message, "plan:\n"); ok {
			e.mu.Lock()
			e.plans = append(e.plans, plan)
			e.mu.Unlock()
		}
	}
	cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;
SET auto_explain.log_analyze = on; SET auto_explain.log_timing = off; SET auto_explain.log_format = json;
SET auto_explain.log_level = notice`)
		return err
	}
	e.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(e.pool.Close)
	return e
}

// rowsRead sums, over every plan kept, the rows the scans of table rel read: those they
// returned and those their filters removed.
func (e *explained) rowsRead(t *testing.T, rel string) int {
	t.Helper()
	type node struct {
		Type           string  `json:"Node Type"`
		Relation       string  `json:"Relation Name"`
		Rows           float64 `json:"Actual Rows"`
		Loops          float64 `json:"Actual Loops"`
		RemovedFilter  float64 `json:"Rows Removed by Filter"`
		RemovedRecheck float64 `json:"Rows Removed by Index Recheck"`
		Plans          []node  `json:"Plans"`
	}
	var sum float64
	var walk func(n node)
	walk = func(n node) {
		if n.Relation == rel && n.Type != "ModifyTable" { // a scan (the update's rows are its scan's)
			sum += n.Rows*n.Loops + n.RemovedFilter + n.RemovedRecheck
		}
		for _, c := range n.Plans {
			walk(c)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	require.NotEmpty(t, e.plans, "no plan was sent (auto_explain)")
	for _, p := range e.plans {
		var top struct {
			Plan node `json:"Plan"`
		}
		require.NoError(t, json.Unmarshal([]byte(p), &top), p)
		walk(top.Plan)
	}
	return int(sum)
}

// TestStore_RetryDeadLateDeathBehindTheCursor: a death that commits while a retry runs, with a
// finished_at (its transaction's start) before the run began and behind the run's cursor, is
// left dead by the run, as its doc comment says, and the next retry takes it.
func TestStore_RetryDeadLateDeathBehindTheCursor(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	var dead []string
	for range 4 {
		dead = append(dead, b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1).ID)
	}
	late := b.Create(t, jobstest.Opts{})

	got, err := b.Store.RetryDead(ctx, jobs.DeadFilter{}, &jobs.RetryDeadOpts{Batch: 2,
		BatchFunc: func(ctx context.Context, retried []jobs.Unfinished) error {
			if retried[0].ID != dead[0] {
				return nil
			}
			// After the first batch: late dies, with a finished_at before any of the batch's.
			_, err := b.Pool.Exec(ctx, `UPDATE jobs SET status = 'dead', dead_reason = 'retries_exhausted',
	finished_at = (SELECT min(created_at) FROM jobs) - interval '1 second' WHERE id = $1`, late.ID)
			return err
		}})
	require.NoError(t, err)
	require.Equal(t, dead, unfinishedIDs(got))
	require.Equal(t, jobs.StatusDead, getStatus(t, b, late.ID), "behind the cursor: left dead")

	got, err = b.Store.RetryDead(ctx, jobs.DeadFilter{}, nil)
	require.NoError(t, err)
	require.Equal(t, []string{late.ID}, unfinishedIDs(got), "the next retry takes it")
}
