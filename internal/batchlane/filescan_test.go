package batchlane_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/pgtest"
)

// nextTry returns the next_try_at of a file as text ("infinity", "-infinity" or a time).
func (b *testBundle) nextTry(t *testing.T, credential, id string) string {
	t.Helper()
	var next string
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT next_try_at::text FROM provider_batch_files
WHERE credential = $1 AND file_id = $2`, credential, id).Scan(&next))
	return next
}

// TestBatcher_MovesALastReleaseGiveUpOutOfRange: a file a leader of the last release gave up on
// (attempts used up, next_try_at left at its last backoff, in the past) is moved out of the
// range the pass scans (next_try_at infinity, as this release gives up) by the next pass, with
// no call to the provider, nothing counted or logged, its attempts and last error kept; a file
// of a credential no longer configured too. A file whose attempts are not used up is left as it
// is. Before, such rows kept their time and every pass read them again.
func TestBatcher_MovesALastReleaseGiveUpOutOfRange(t *testing.T) {
	t.Parallel()
	var deletes atomic.Int64
	b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodDelete {
				deletes.Add(1)
			}
			sim.ServeHTTP(w, r)
		})
	}})
	past, later := b.clock.Now().Add(-3*time.Hour), b.clock.Now().Add(time.Hour)
	_, err := b.pool.Exec(t.Context(), `INSERT INTO provider_batch_files
(credential, file_id, batch, kind, attempts, next_try_at, last_error) VALUES
('default', 'file-old-given-up', gen_random_uuid(), 'ended', $1, $2, 'delete file: 500'),
('removed', 'file-old-given-up', gen_random_uuid(), 'ended', $1, $2, 'delete file: 500'),
('default', 'file-failing', gen_random_uuid(), 'ended', $1 - 1, $3, 'delete file: 500')`,
		batchlane.MaxFileDeleteAttempts, past, later)
	require.NoError(t, err)

	once(t, b.batcher(nil))
	require.Equal(t, "infinity", b.nextTry(t, "default", "file-old-given-up"))
	require.Equal(t, "infinity", b.nextTry(t, "removed", "file-old-given-up"), "an unconfigured credential's")
	require.NotEqual(t, "infinity", b.nextTry(t, "default", "file-failing"), "a file not given up")
	require.Zero(t, deletes.Load(), "a given-up file was deleted")
	require.Zero(t, b.counter(t, "file_deletes", "gave_up"))
	require.Zero(t, b.counter(t, "file_deletes", "failed"))
	listed, err := batchlane.ListFiles(t.Context(), b.pool, batchlane.FilesFilter{GivenUp: true})
	require.NoError(t, err)
	require.Len(t, listed, 2)
	for _, f := range listed {
		require.Equal(t, batchlane.MaxFileDeleteAttempts, f.Attempts)
		require.Equal(t, "delete file: 500", *f.LastError)
	}

	// Retried, it is due at once and deleted.
	_, err = batchlane.RetryFiles(t.Context(), b.pool, batchlane.RetryFilesParams{IDs: []string{"file-old-given-up"},
		Credential: "default"})
	require.NoError(t, err)
	once(t, b.batcher(nil))
	require.Equal(t, int64(1), deletes.Load())
	require.Equal(t, float64(1), b.counter(t, "file_deletes", "deleted"))
}

// TestBatcher_BoundsTheOldGiveUpsAPassMoves: a backlog of files a leader of the last release gave
// up on is moved out of range OldGiveUpsPerPass a pass, the rest by the passes after, so that
// the first pass after an upgrade does not update them all in one statement.
func TestBatcher_BoundsTheOldGiveUpsAPassMoves(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	_, err := b.pool.Exec(t.Context(), `INSERT INTO provider_batch_files (credential, file_id, batch, kind, attempts, next_try_at)
SELECT 'default', 'file-' || i, gen_random_uuid(), 'ended', $2, $3 FROM generate_series(1, $1) AS i`,
		batchlane.OldGiveUpsPerPass+1, batchlane.MaxFileDeleteAttempts, b.clock.Now().Add(-time.Hour))
	require.NoError(t, err)
	inRange := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM provider_batch_files
WHERE next_try_at <> 'infinity'`).Scan(&n))
		return n
	}
	once(t, b.batcher(nil))
	require.Equal(t, 1, inRange(), "one pass moved more than its bound")
	once(t, b.batcher(nil))
	require.Zero(t, inRange())
	require.Equal(t, batchlane.OldGiveUpsPerPass+1, b.fileRows(t), "a row removed")
}

// TestBatcher_LeavesAFileRetriedWhileItMovesOldGiveUps: a file a leader of the last release gave
// up on that an operator retries (ctl batch files retry) while the pass moves it out of range
// keeps the retry (no attempts, due at once) and is deleted by the next pass: the move does not
// make it a file with attempts left that no pass reads, which ctl could not list (infinity is no
// time).
func TestBatcher_LeavesAFileRetriedWhileItMovesOldGiveUps(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	_, err := b.pool.Exec(t.Context(), `INSERT INTO provider_batch_files
(credential, file_id, batch, kind, attempts, next_try_at, last_error)
VALUES ('default', 'file-old-given-up', gen_random_uuid(), 'ended', $1, $2, 'delete file: 500')`,
		batchlane.MaxFileDeleteAttempts, b.clock.Now().Add(-3*time.Hour))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	watch, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig)
	require.NoError(t, err)
	defer watch.Close(context.Background())

	// The retry holds the row (RetryFiles's statement, its transaction not committed yet)
	retry, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = retry.Rollback(context.Background()) }()
	_, err = retry.Exec(ctx, `UPDATE provider_batch_files SET attempts = 0, next_try_at = '-infinity'
WHERE file_id = 'file-old-given-up'`)
	require.NoError(t, err)
	// while the pass's move waits for it,
	passed := make(chan error, 1)
	go func() { passed <- b.batcher(nil).Once(ctx) }()
	require.Empty(t, pgtest.LockWaitingOrAnswered(ctx, t, watch, passed, 1, "the pass's move"),
		"the pass did not wait for the retry's row")
	require.NoError(t, retry.Commit(ctx))
	select {
	case err := <-passed:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the pass did not end")
	}
	require.Equal(t, "-infinity", b.nextTry(t, "default", "file-old-given-up"), "the retry undone")
	once(t, b.batcher(nil))
	require.Zero(t, b.fileRows(t), "the retried file not deleted")
}

// tuplesRead returns the heap tuples read from provider_batch_files so far (sequential scans
// and index fetches), as Postgres's statistics count them, once pool's only connection has
// flushed its own counts.
func tuplesRead(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	_, err := pool.Exec(t.Context(), `SELECT pg_stat_force_next_flush()`) // flushed before the answer
	require.NoError(t, err)
	var n int64
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT seq_tup_read + coalesce(idx_tup_fetch, 0)
FROM pg_stat_user_tables WHERE relname = 'provider_batch_files'`).Scan(&n))
	return n
}

// TestBatcher_PassSkipsUnconfiguredCredentialsFiles: the files of a credential no longer
// configured (never tried, so due at once: next_try_at -infinity, first on the index the pass
// scans) are not read by every pass once they outnumber the configured credentials' rows: the
// pass's query is planned for its credentials each time, and reads those through the primary
// key. Before, its prepared statement's generic plan read every one of them in each pass.
func TestBatcher_PassSkipsUnconfiguredCredentialsFiles(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai"})
	const unconfigured = 5000
	_, err := b.pool.Exec(t.Context(), `INSERT INTO provider_batch_files (credential, file_id, batch, kind)
SELECT 'removed', 'file-' || i, gen_random_uuid(), 'ended' FROM generate_series(1, $1) AS i`, unconfigured)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `INSERT INTO provider_batch_files (credential, file_id, batch, kind)
SELECT 'default', 'file-gone-' || i, gen_random_uuid(), 'ended' FROM generate_series(1, 10) AS i`)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `ANALYZE provider_batch_files`)
	require.NoError(t, err)

	// One connection, so that the pass's statements are prepared (or not) where they run and its
	// counts are flushed by tuplesRead.
	cfg := b.pool.Config().Copy()
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	bt := batchlane.New(batchlane.Config{Pool: pool, Now: b.clock.Now, Metrics: b.metrics,
		Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
		Enqueue: b.enqueue})
	for range 10 { // past the passes Postgres plans anew before it may keep a generic plan
		once(t, bt)
	}
	require.Equal(t, float64(10), b.counter(t, "file_deletes", "deleted"), "the configured credential's files")
	require.Equal(t, unconfigured, b.fileRows(t))

	before := tuplesRead(t, pool)
	once(t, bt)
	read := tuplesRead(t, pool) - before
	require.Less(t, read, int64(unconfigured/10), "a pass read the unconfigured credential's rows")
}
