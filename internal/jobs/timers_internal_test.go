package jobs

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestBatcher_OwnStatementAllocs pins the allocations of a statement the batcher runs on its
// caller's goroutine (runOwn: nothing out or waiting) under a caller's deadline sooner than the
// batch's bound (batchTimeout from now), as the API's submits and polls have theirs (StoreTimeout,
// 10 s too, set before): the statement run with the caller's context, and its batchOp, nothing
// more. A batch's bound was made at every such statement, a cancel-only child then (its
// parent's deadline the sooner: context.WithDeadline makes no timer), which bounds nothing more.
func TestBatcher_OwnStatementAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pgx's pooled buffers at random")
	}
	b := &batcher{pool: pgtest.Pool(t)}
	ctx, cancel := context.WithTimeout(context.Background(), batchTimeout)
	defer cancel()
	var one int
	scan := func(r pgx.Row) error { return r.Scan(&one) }
	const sql = `SELECT 1`
	require.NoError(t, b.queryRow(ctx, "k", sql, nil, scan)) // a connection made, and idle
	require.Equal(t, 1, one)
	// The floor: the statement run alone with the caller's context, its batchOp made once.
	op := &batchOp{ctx: ctx, key: "k", sql: sql, scan: scan}
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
