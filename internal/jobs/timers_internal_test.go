package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// allocsBatcher returns a batcher on a test database, a context bounded by batchTimeout and a
// scan of `SELECT 1` that fails unless the row is 1, for the tests that count a statement's
// allocations; it skips them under the race detector.
func allocsBatcher(t *testing.T) (*batcher, context.Context, func(pgx.Row) error) {
	t.Helper()
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pgx's pooled buffers at random")
	}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	t.Cleanup(cancel)
	var one int // outside the scan, as a caller's destination is: not counted at each statement
	scan := func(r pgx.Row) error {
		if err := r.Scan(&one); err != nil {
			return err
		}
		if one != 1 {
			return fmt.Errorf("SELECT 1 answered %d", one)
		}
		return nil
	}
	return &batcher{pool: pgtest.Pool(t)}, ctx, scan
}

// TestBatcher_OwnStatementAllocs pins the allocations of a statement the batcher runs on its
// caller's goroutine (runOwn: nothing out or waiting) under a caller's deadline sooner than the
// batch's bound (batchTimeout from now), as the API's submits and polls have theirs (StoreTimeout,
// 10 s too, set before): the statement run with the caller's context, and its batchOp, nothing
// more. A batch's bound was made at every such statement, a cancel-only child then (its
// parent's deadline the sooner: context.WithDeadline makes no timer), which bounds nothing more.
func TestBatcher_OwnStatementAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	b, ctx, scan := allocsBatcher(t)
	const sql = `SELECT 1`
	require.NoError(t, b.queryRow(ctx, "k", sql, nil, scan)) // a connection made, and idle
	// The floor: the statement run alone with the caller's context, its batchOp made once.
	op := &batchOp{ctx: ctx, key: "k", sql: sql, scan: scanFunc(scan)}
	floor := testing.AllocsPerRun(200, func() {
		if err := b.runAlone(ctx, op); err != nil {
			panic(err)
		}
	})
	allocs := testing.AllocsPerRun(200, func() {
		if err := b.queryRow(ctx, "k", sql, nil, scan); err != nil {
			panic(err)
		}
	})
	t.Logf("own statement: %.1f allocations, alone with the caller's context %.1f", allocs, floor)
	// The one more is queryRow's own: the statement's batchOp.
	require.LessOrEqual(t, allocs, floor+1, "allocations per own statement beyond its run")
}

// TestBatcher_AloneAllocs pins the allocations of a statement the batcher runs alone
// (queryAlone) beside pgx's for its batch: the batch, its two statements and their list made
// in one allocation (aloneBatch), lockTimeoutSQL's argument boxed once. Queued one by one, they
// were 7.
func TestBatcher_AloneAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	b, ctx, scan := allocsBatcher(t)
	pool := b.pool
	op := &batchOp{ctx: ctx, key: "k", sql: `SELECT 1`, scan: scanFunc(scan)}
	require.NoError(t, b.queryAlone(ctx, op)) // a connection made, and idle
	// The floor: the same batch, made once, sent as queryAlone sends it.
	batch := &pgx.Batch{QueuedQueries: []*pgx.QueuedQuery{
		{SQL: lockTimeoutSQL, Arguments: []any{lockTimeoutSetting}},
		{SQL: op.sql},
	}}
	floor := testing.AllocsPerRun(200, func() {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			panic(err)
		}
		defer conn.Release()
		br := conn.SendBatch(ctx, batch)
		if _, err := br.Exec(); err != nil {
			panic(err)
		}
		if err := scan(br.QueryRow()); err != nil {
			panic(err)
		}
		if err := br.Close(); err != nil {
			panic(err)
		}
	})
	allocs := testing.AllocsPerRun(200, func() {
		if err := b.queryAlone(ctx, op); err != nil {
			panic(err)
		}
	})
	t.Logf("alone: %.1f allocations, its batch made once %.1f", allocs, floor)
	require.LessOrEqual(t, allocs, floor+1, "allocations per statement run alone beyond its batch's sending")
}

// TestInsertJob_Allocs pins the allocations of a submit's insert statement (insertJob: a job
// without a key, not started): its arguments' list, with the tenant, credential and timeout its
// arguments point at, and the values boxed into it that are not constants (the ID, request,
// metadata and fallbacks: 5). The tenant, credential and timeout boxed were 3 more (8); its SQL
// was concatenated at every call (jobColumnsNoRequest was a variable), and its lane, priority
// and lease's length boxed at every call: 12.
func TestInsertJob_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("allocations are counted without the race detector")
	}
	p := CreateParams{ID: "01900000-0000-7000-8000-000000000000", Tenant: "acme", Credential: "c",
		Request: json.RawMessage(`{"model":"m"}`), Metadata: json.RawMessage(`{}`), MaxAttempts: 3,
		Timeout: time.Hour, Fallbacks: []string{"d"}}
	var sql string
	var args []any
	allocs := testing.AllocsPerRun(200, func() {
		sql, args = insertJob(p.ID, nil, p, nil)
	})
	require.Contains(t, sql, jobColumnsNoRequest)
	require.Len(t, args, 16)
	require.Equal(t, []any{"online", PriorityNormal}, args[12:14])
	require.Equal(t, int64(15000), args[15])
	t.Logf("insertJob: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 5.0, "allocations per insert statement")
}

// TestFinish_Allocs pins the allocations of an attempt's record (Finish, a success's: every
// job's end) beside its statement run by the batcher with its arguments and scan made once: its
// arguments' values that are boxed (the ID, result and usage) and one finishQuery, where the
// floor makes a batchOp: no more than the floor, without slack (AllocsPerRun's average drops a
// stray allocation; each valuer's cut alone is 1 or 2). The arguments' list, the scan's closure,
// the event_seq it scanned into, Scan's argument, the Outcome (moved to the heap by the dead
// reason's pointer) and the event's payload boxed at every call were 6 more (16 against the
// floor's 45 for this row); the status, answering credential, attempt's credential, class,
// start, latency and TTFB boxed (or, a pointer, read back by pgx through reflect) 10 more (54
// where it is 44).
func TestFinish_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pgx's pooled buffers at random")
	}
	ctx, _, s, created := scanSetup(t)
	job, err := s.BeginAttempt(ctx, created.ID)
	require.NoError(t, err)
	a := &Attempt{Number: 1, Credential: "c", StartedAt: time.Now().UTC().Truncate(time.Microsecond),
		Latency: 300 * time.Millisecond, TTFB: 200 * time.Millisecond, StatusCode: 200, Class: "ok",
		LeaseToken: *job.LeaseToken}
	o := Outcome{Status: StatusSucceeded, Result: json.RawMessage(`{}`), Usage: json.RawMessage(`{"input_tokens":1}`),
		AnsweredBy: "c"}
	applied, err := s.Finish(ctx, job.ID, a, o) // stored; every run after is a repeat, applied
	require.NoError(t, err)
	require.True(t, applied)
	// The floor: the statement run by the batcher, its arguments and scan made once.
	rec := attemptRecord(a)
	args := []any{job.ID, o.Status, nullJSON(o.Result), nullJSON(o.Usage), []byte(nil), (*string)(nil),
		o.NextAttemptAt, nullString(o.AnsweredBy), o.NextCredential, leaseOf(a), true, rec.number,
		rec.credential, rec.startedAt, rec.latencyMS, rec.ttfbMS, rec.status, rec.class,
		rec.retryAfterMS, rec.delayMS, rec.err, []byte(`{}`), rec.usage}
	var seq int
	scan := func(r pgx.Row) error { return r.Scan(&seq) }
	floor := testing.AllocsPerRun(100, func() {
		if err := s.batch.queryRow(ctx, job.ID, finishSQL, args, scan); err != nil {
			panic(err)
		}
	})
	allocs := testing.AllocsPerRun(100, func() {
		if applied, err := s.Finish(ctx, job.ID, a, o); err != nil || !applied {
			panic(fmt.Sprint(applied, err))
		}
	})
	t.Logf("Finish: %.1f allocations, its statement by the batcher %.1f", allocs, floor)
	require.LessOrEqual(t, allocs, floor, "allocations per Finish beyond its statement's")
}

// nullString is s as an argument, nil (NULL) when empty.
func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
