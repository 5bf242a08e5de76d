package audit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestDeleteBefore_ReadsAboutItsLimit: a call reads about the entries it deletes, not the whole
// expired backlog. It looked for the first entry to keep in the whole log, reading every expired
// entry each call (5,000 here for a call of 100), so a large backlog cost about N²/limit reads.
// Counted in the statement's own transaction (pg_stat_xact_user_tables), so no timing is judged.
func TestDeleteBefore_ReadsAboutItsLimit(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `INSERT INTO audit_log (at, operator, action)
SELECT now() - interval '400 days', 'alice', 'dead.retry' FROM generate_series(1, 5000)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO audit_log (operator, action) VALUES ('alice', 'dead.retry')`)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	tag, err := tx.Exec(ctx, deleteBeforeSQL, time.Now().Add(-365*24*time.Hour), 100)
	require.NoError(t, err)
	require.EqualValues(t, 100, tag.RowsAffected())
	var read int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
FROM pg_stat_xact_user_tables WHERE relname = 'audit_log'`).Scan(&read))
	require.Less(t, read, int64(1000), "entries read to delete 100 of 5,000 expired ones")
}
