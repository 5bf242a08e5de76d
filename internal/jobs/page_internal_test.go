package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestStore_PageUsesIndex: the console pages through every tenant's jobs newest first. Each page
// must start in jobs_created_idx at its cursor and stop at its limit: read Limit+1 rows, never
// the table, never sort, however deep the page (so a page on 10 million rows costs what it costs
// on 100,000). With a tenant it reads jobs_tenant_created_idx the same way. The table is not
// analyzed (the planner's worst case); the plan is taken with EXPLAIN ANALYZE on 100,000 rows.
func TestStore_PageUsesIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, tenant, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, created_at)
SELECT gen_random_uuid(), 't' || g % 10, 'c' || g % 3, 'f', (ARRAY['queued', 'succeeded', 'dead'])[1 + g % 3], '{}', 3, 60000,
	now(), now() - g * interval '1 millisecond'
FROM generate_series(1, 100000) g`)
	require.NoError(t, err)
	store := NewStore(pool, nil)

	// A cursor deep in the table: the 80,000th newest job.
	var mid Job
	require.NoError(t, pool.QueryRow(ctx, `SELECT created_at, id::text FROM jobs ORDER BY created_at DESC, jobs.id DESC OFFSET 80000 LIMIT 1`).
		Scan(&mid.CreatedAt, &mid.ID))
	cursor := encodeCursor(mid.CreatedAt, mid.ID)

	for _, c := range []struct {
		p     PageParams
		index string
	}{
		{PageParams{After: cursor, Limit: 50}, "jobs_created_idx"},
		{PageParams{After: cursor, Limit: 50, Status: StatusSucceeded}, "jobs_created_idx"},
		{PageParams{After: cursor, Limit: 50, Credential: "c1"}, "jobs_created_idx"},
		{PageParams{After: cursor, Limit: 50, Tenant: "t3"}, "jobs_tenant_created_idx"},
	} {
		sql, args, err := pageQuery(c.p, nil)
		require.NoError(t, err)
		var raw []byte
		require.NoError(t, store.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, args...).Scan(&raw)
		}))
		plan := string(raw)
		require.Contains(t, plan, `"Index Name": "`+c.index+`"`, "%+v", c.p)
		require.NotContains(t, plan, `"Node Type": "Sort"`)
		if c.index == "jobs_created_idx" { // (created_at, id): the page's order, no sort at all
			require.NotContains(t, plan, `Sort"`, "%+v: %s", c.p, plan)
		}
		require.NotContains(t, plan, `"Node Type": "Seq Scan"`)
		var out []struct {
			Plan struct {
				Plans []struct {
					ActualRows   float64 `json:"Actual Rows"`
					RowsFiltered float64 `json:"Rows Removed by Filter"`
				} `json:"Plans"`
			} `json:"Plan"`
		}
		require.NoError(t, json.Unmarshal(raw, &out))
		scan := out[0].Plan.Plans[0]
		require.Equal(t, float64(51), scan.ActualRows, "Limit+1 rows, %+v", c.p)
		// A filter on a status or credential that is a third of the rows reads ~3 rows per hit.
		require.Less(t, scan.RowsFiltered, float64(200), "%+v", c.p)
	}

	// A filtered page's bound (the PageScanRows-th job from the cursor) is read from the page's
	// index alone, and the page reads no row past it: a filter that matches nothing reads
	// PageScanRows rows, not the 80,000 left.
	for _, c := range []struct {
		p     PageParams
		index string
	}{
		{PageParams{After: cursor, Limit: 50, Credential: "none"}, "jobs_created_idx"},
		{PageParams{Limit: 50, Tenant: "t3", Status: StatusFailed}, "jobs_tenant_created_idx"},
	} {
		bsql, bargs, err := pageBoundQuery(c.p)
		require.NoError(t, err)
		var raw []byte
		var b pageBound
		require.NoError(t, store.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
			if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+bsql, bargs...).Scan(&raw); err != nil {
				return err
			}
			return tx.QueryRow(ctx, bsql, bargs...).Scan(&b.at, &b.id)
		}))
		require.Contains(t, string(raw), `"Index Name": "`+c.index+`"`, "%+v", c.p)
		require.NotContains(t, string(raw), `"Node Type": "Seq Scan"`)
		if c.index == "jobs_created_idx" {
			require.NotContains(t, string(raw), `Sort"`, "%+v: %s", c.p, raw)
		}
		sql, args, err := pageQuery(c.p, &b)
		require.NoError(t, err)
		require.NoError(t, store.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, args...).Scan(&raw)
		}))
		require.Contains(t, string(raw), `"Index Name": "`+c.index+`"`, "%+v", c.p)
		var out []struct {
			Plan struct {
				Plans []struct {
					ActualRows   float64 `json:"Actual Rows"`
					RowsFiltered float64 `json:"Rows Removed by Filter"`
				} `json:"Plans"`
			} `json:"Plan"`
		}
		require.NoError(t, json.Unmarshal(raw, &out))
		scan := out[0].Plan.Plans[0]
		require.LessOrEqual(t, scan.ActualRows+scan.RowsFiltered, float64(PageScanRows), "%+v: %s", c.p, raw)
	}

	// And Page walks it: the page after the cursor starts right after it.
	page, err := store.Page(ctx, PageParams{After: cursor, Limit: 3})
	require.NoError(t, err)
	require.Len(t, page.Jobs, 3)
	require.True(t, page.Jobs[0].CreatedAt.Before(mid.CreatedAt) || page.Jobs[0].CreatedAt.Equal(mid.CreatedAt))
	require.NotEqual(t, mid.ID, page.Jobs[0].ID)
	require.NotEmpty(t, page.Next)
}

func TestCursor_RoundTripAndGarbage(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"x", "!!", encodeCursor(Job{}.CreatedAt, "nope"), "MTIz"} {
		_, _, err := decodeCursor(bad)
		require.ErrorIs(t, err, ErrBadCursor, bad)
	}
}

// TestStats_AttemptsCountReadsTheBRIN: ctl stats and the console's overview count the attempts
// of the last hour through job_attempts_started_brin (migration 015), not by reading the table.
func TestStats_AttemptsCountReadsTheBRIN(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, class)
SELECT gen_random_uuid(), 1, 'c', now() - g * interval '1 second', 1, 'success' FROM generate_series(1, 50000) g`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE job_attempts`)
	require.NoError(t, err)
	var plan string
	require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON)
SELECT count(*), count(*) FILTER (WHERE attempt > 1) FROM job_attempts WHERE started_at >= $1`, time.Now().Add(-time.Hour)).Scan(&plan))
	require.Contains(t, plan, `"Index Name": "job_attempts_started_brin"`)
}

// TestStore_PageOrdersIDsAsUUIDs: Page's cursor compares ids as uuids (bytes), so its pages must
// be ordered so too, whatever the database's collation. Ordered by the ids' text (the output
// column id::text was ORDER BY's "id"), a database whose collation compares runs of digits by
// their value (an ICU locale with kn, "natural" order: "9a" before "10a") skipped jobs that
// share a created_at: those after the page's last one in text order but before it in uuid order
// were on no page.
func TestStore_PageOrdersIDsAsUUIDs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := pgtest.ICUPool(ctx, t, "und-u-kn")
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, tenant, credential, fingerprint, status, request, max_attempts, timeout_ms,
	deadline, created_at)
SELECT (g || 'a' || repeat('0', 31 - length(g::text)))::uuid, 't', 'c', 'f', 'succeeded', '{}', 3, 60000, now(),
	'2026-01-02T03:04:05Z'
FROM generate_series(1, 64) g`) // ids 1a000000-..., 10a00000-..., 9a000000-...: text and uuid orders differ
	require.NoError(t, err)
	var natural bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT '9a'::text < '10a'::text`).Scan(&natural))
	require.True(t, natural, "the collation must compare digits by their value")
	store := NewStore(pool, nil)

	for _, p := range []PageParams{{Limit: 5}, {Limit: 5, Status: StatusSucceeded}, {Limit: 5, Tenant: "t"}} {
		seen := map[string]bool{}
		for page := 0; ; page++ {
			require.Less(t, page, 64, "%+v: pages never end", p)
			got, err := store.Page(ctx, p)
			require.NoError(t, err)
			for _, j := range got.Jobs {
				require.False(t, seen[j.ID], "%+v: %s on two pages", p, j.ID)
				seen[j.ID] = true
			}
			if got.Next == "" {
				break
			}
			p.After = got.Next
		}
		require.Len(t, seen, 64, "%+v: every job on a page", p)
	}

	// The dead letters' pages likewise, ordered by (finished_at, id).
	_, err = pool.Exec(ctx, `UPDATE jobs SET status = 'dead', dead_reason = 'retries_exhausted', finished_at = created_at`)
	require.NoError(t, err)
	seen, after := map[string]bool{}, ""
	for page := 0; ; page++ {
		require.Less(t, page, 64, "dead letters: pages never end")
		got, err := store.PageDead(ctx, DeadFilter{Limit: 5}, after)
		require.NoError(t, err)
		for _, j := range got.Jobs {
			require.False(t, seen[j.ID], "dead letters: %s on two pages", j.ID)
			seen[j.ID] = true
		}
		if got.Next == "" {
			break
		}
		after = got.Next
	}
	require.Len(t, seen, 64, "every dead letter on a page")
}
