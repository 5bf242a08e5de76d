package audit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/pgtest"
)

func TestLog_List(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	e, err := audit.Log(ctx, pool, audit.Entry{Operator: "alice", Action: "dead.retry", Count: 3,
		Detail: map[string]any{"ids": []string{"a", "b", "c"}}})
	require.NoError(t, err)
	require.NotZero(t, e.ID)
	require.False(t, e.At.IsZero())
	_, err = audit.Log(ctx, pool, audit.Entry{Operator: "bob", Action: "tenant.create", Target: "acme", Count: 1})
	require.NoError(t, err)

	all, err := audit.List(ctx, pool, audit.ListParams{})
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, "tenant.create", all[0].Action, "newest first")
	require.Equal(t, "acme", all[0].Target)
	require.Nil(t, all[0].Detail)
	require.Equal(t, 3, all[1].Count)
	require.Equal(t, []any{"a", "b", "c"}, all[1].Detail["ids"])

	alice, err := audit.List(ctx, pool, audit.ListParams{Operator: "alice", Limit: 10})
	require.NoError(t, err)
	require.Len(t, alice, 1)
	require.Equal(t, "alice", alice[0].Operator)
}

// TestDeleteBefore_StopsAtTheFirstEntryToKeep: the expired entries go oldest id first, limit a
// call, up to the first entry written at or after the cutoff; an expired entry after it (written
// out of order) waits for that boundary to expire.
func TestDeleteBefore_StopsAtTheFirstEntryToKeep(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	// e1-e4 expired, e5 kept, e6-e7 expired but written after it, e8 kept.
	for i, ageDays := range []int{400, 400, 400, 400, 1, 400, 400, 1} {
		_, err := pool.Exec(ctx, `INSERT INTO audit_log (at, operator, action) VALUES (now() - make_interval(days => $1), 'alice', $2)`,
			ageDays, fmt.Sprintf("e%d", i+1))
		require.NoError(t, err)
	}
	cutoff := time.Now().Add(-365 * 24 * time.Hour)
	for _, want := range []int64{3, 1, 0} {
		n, err := audit.DeleteBefore(ctx, pool, cutoff, 3)
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	rows, err := pool.Query(ctx, `SELECT action FROM audit_log ORDER BY id`)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"e5", "e6", "e7", "e8"}, left, "the entries from the first to keep on stay")
}

// TestListPage_Pages: the log is read a page at a time, newest first, each page going on from the
// previous one's Next (with the operator filter kept) until a last page whose Next is ""; a
// cursor no page made is ErrBadCursor.
func TestListPage_Pages(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	for i := range 5 {
		op := "alice"
		if i%2 == 1 {
			op = "bob"
		}
		_, err := audit.Log(ctx, pool, audit.Entry{Operator: op, Action: "login", Count: i})
		require.NoError(t, err)
	}

	var counts []int
	p := audit.ListParams{Limit: 2}
	for range 3 {
		page, err := audit.ListPage(ctx, pool, p)
		require.NoError(t, err)
		for _, e := range page.Entries {
			counts = append(counts, e.Count)
		}
		p.After = page.Next
		if p.After == "" {
			break
		}
	}
	require.Equal(t, []int{4, 3, 2, 1, 0}, counts, "every entry once, newest first")
	require.Empty(t, p.After, "the third page is the last")

	page, err := audit.ListPage(ctx, pool, audit.ListParams{Operator: "alice", Limit: 2})
	require.NoError(t, err)
	require.Len(t, page.Entries, 2)
	require.NotEmpty(t, page.Next)
	page, err = audit.ListPage(ctx, pool, audit.ListParams{Operator: "alice", Limit: 2, After: page.Next})
	require.NoError(t, err)
	require.Len(t, page.Entries, 1)
	require.Equal(t, 0, page.Entries[0].Count)
	require.Empty(t, page.Next, "the last page")

	for _, bad := range []string{"x", "0", "-3", "1.5", "99999999999999999999"} {
		_, err := audit.ListPage(ctx, pool, audit.ListParams{After: bad})
		require.ErrorIs(t, err, audit.ErrBadCursor, bad)
	}
}
