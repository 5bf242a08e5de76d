package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// batchFileRow is a row of provider_batch_files as a test seeds it.
type batchFileRow struct {
	credential, id, kind, lastError string
	attempts                        int
	nextTry                         time.Time // zero: -infinity (due at once)
	createdAgo                      time.Duration
}

// seedBatchFiles inserts rows into provider_batch_files, as the batch lane records them and
// its deletes leave them; their batch has no provider_batches row (retention deleted it).
func (b *jobsBundle) seedBatchFiles(t *testing.T, rows ...batchFileRow) {
	t.Helper()
	for _, r := range rows {
		next := "-infinity"
		if !r.nextTry.IsZero() {
			next = r.nextTry.Format(time.RFC3339Nano)
		}
		var lastError any
		if r.lastError != "" {
			lastError = r.lastError
		}
		_, err := b.pool.Exec(context.Background(), `INSERT INTO provider_batch_files
(credential, file_id, batch, kind, attempts, next_try_at, last_error, created_at)
VALUES ($1, $2, '00000000-0000-0000-0000-000000000001', $3, $4, $5::text::timestamptz, $6, now() - $7::interval)`,
			r.credential, r.id, r.kind, r.attempts, next, lastError, r.createdAgo.String())
		require.NoError(t, err)
	}
}

// batchFileState is a file's attempts and whether it is due at once (next_try_at -infinity).
func (b *jobsBundle) batchFileState(t *testing.T, credential, id string) (attempts int, dueAtOnce bool) {
	t.Helper()
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT attempts, next_try_at = '-infinity'
FROM provider_batch_files WHERE credential = $1 AND file_id = $2`, credential, id).Scan(&attempts, &dueAtOnce))
	return attempts, dueAtOnce
}

// seedThreeFiles seeds file-a and file-b, given up (of credentials default and backup), and
// file-c, of default, whose deletes failed 4 times.
func (b *jobsBundle) seedThreeFiles(t *testing.T) {
	t.Helper()
	later := time.Now().Add(time.Hour)
	b.seedBatchFiles(t,
		batchFileRow{credential: "default", id: "file-a", kind: "ended", attempts: 10, nextTry: later, lastError: "500"},
		batchFileRow{credential: "backup", id: "file-b", kind: "ended", attempts: 10, nextTry: later, lastError: "500"},
		batchFileRow{credential: "default", id: "file-c", kind: "upload", attempts: 4, nextTry: later, lastError: "500"},
	)
}

// TestBatchFiles_ListsTheFilesNotDeleted: `ctl batch files` lists every recorded file, the
// given-up ones first (marked), then the newest; --given-up keeps those only, --credential one
// credential's; --json prints them all with their fields.
func TestBatchFiles_ListsTheFilesNotDeleted(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url}

	r := run(t, append(db, "batch", "files")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "no batch files left to delete\n", r.out)
	r = run(t, append(db, "batch", "files", "--given-up")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "no given-up batch files\n", r.out)

	next := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Second)
	b.seedBatchFiles(t,
		batchFileRow{credential: "default", id: "file-new", kind: "ended", createdAgo: time.Minute},
		batchFileRow{credential: "default", id: "file-failing", kind: "ended", attempts: 3, nextTry: next,
			lastError: "delete file: 500 server error", createdAgo: 2 * time.Hour},
		batchFileRow{credential: "backup", id: "file-gone", kind: "upload", attempts: 10, nextTry: next,
			lastError: "delete file: 403\nforbidden", createdAgo: 48 * time.Hour},
	)

	r = run(t, append(db, "batch", "files")...)
	require.Equal(t, 0, r.code, r.errOut)
	rows := tableRows(r.out)
	require.Len(t, rows, 4, r.out)
	require.Equal(t, []string{"CREDENTIAL", "FILE", "BATCH", "KIND", "ATTEMPTS", "NEXT TRY", "LAST ERROR"}, rows[0])
	require.Equal(t, "backup", rows[1][0], r.out)
	require.Equal(t, "file-gone", rows[1][1])
	require.Equal(t, "10 (given up)", rows[1][4])
	require.Equal(t, "-", rows[1][5], "a given-up file is tried no more")
	require.Equal(t, "delete file: 403 forbidden", rows[1][6])
	require.Equal(t, []string{"default", "file-new", "00000000-0000-0000-0000-000000000001", "ended", "0", "now", "-"}, rows[2])
	require.Equal(t, "file-failing", rows[3][1])
	require.Equal(t, "3", rows[3][4])
	require.Equal(t, next.Format(time.RFC3339), rows[3][5])

	r = run(t, append(db, "batch", "files", "--given-up")...)
	require.Equal(t, 0, r.code, r.errOut)
	rows = tableRows(r.out)
	require.Len(t, rows, 2, r.out)
	require.Equal(t, "file-gone", rows[1][1])

	r = run(t, append(db, "batch", "files", "--credential", "backup", "--given-up", "--json")...)
	require.Equal(t, 0, r.code, r.errOut)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.out), &list), r.out)
	require.Len(t, list, 1)
	require.Equal(t, "file-gone", list[0]["file_id"])
	require.Equal(t, true, list[0]["given_up"])
	require.Equal(t, float64(10), list[0]["attempts"])

	r = run(t, append(db, "batch", "files", "--credential", "nobody", "--json")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "[]\n", r.out)

	requireOneLineError(t, run(t, append(db, "batch", "files", "extra")...), 2, "usage: ctl batch files")
	requireOneLineError(t, run(t, append(db, "batch", "files", "--limit", "0")...), 2, "--limit must be at least 1")
}

// TestBatchFiles_RetryPutsFilesBackInLine: `ctl batch files retry --all` sets the given-up files
// (of --credential) back to no attempts, due at once, and leaves the others; retry FILE_ID...
// does so to the named ones and names those it did not find (exit 1). Each run writes one audit
// entry counting what it changed.
func TestBatchFiles_RetryPutsFilesBackInLine(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url}
	b.seedThreeFiles(t)

	requireOneLineError(t, run(t, append(db, "batch", "files", "retry")...), 2, "usage: ctl batch files retry")
	requireOneLineError(t, run(t, append(db, "batch", "files", "retry", "--all", "file-a")...), 2, "not both")

	r := run(t, append(db, "batch", "files", "retry", "--all", "--credential", "default")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "put 1 batch file back in line: the batch lane's leader deletes it in its next pass\n", r.out)
	attempts, due := b.batchFileState(t, "default", "file-a")
	require.Equal(t, 0, attempts)
	require.True(t, due)
	attempts, due = b.batchFileState(t, "backup", "file-b")
	require.Equal(t, 10, attempts, "another credential's file is left")
	require.False(t, due)
	attempts, _ = b.batchFileState(t, "default", "file-c")
	require.Equal(t, 4, attempts, "a file not given up is left by --all")

	r = run(t, append(db, "batch", "files", "retry", "--all", "--credential", "default")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "no given-up batch files\n", r.out)

	r = run(t, append(db, "batch", "files", "retry", "file-c", "file-b", "file-x")...)
	require.Equal(t, 1, r.code)
	require.Equal(t, "put 2 batch files back in line: the batch lane's leader deletes them in its next pass\n", r.out)
	require.Equal(t, "ctl: no batch file \"file-x\"\n", r.errOut)
	attempts, due = b.batchFileState(t, "default", "file-c")
	require.Equal(t, 0, attempts)
	require.True(t, due)
	attempts, due = b.batchFileState(t, "backup", "file-b")
	require.Equal(t, 0, attempts)
	require.True(t, due)

	requireOneLineError(t, run(t, append(db, "batch", "files", "retry", "file-a", "--credential", "backup")...), 1,
		`no batch file "file-a" of credential "backup"`)

	entries := auditLog(t, b.url)
	require.Len(t, entries, 4, "one entry a run that changed or asked for something")
	require.Equal(t, 0, entries[0].Count)
	require.Equal(t, map[string]any{"requested": []any{"file-a"}, "credential": "backup"}, entries[0].Detail)
	require.Equal(t, "batch_file.retry", entries[1].Action)
	require.Equal(t, 2, entries[1].Count)
	require.Equal(t, []any{"file-c", "file-b", "file-x"}, entries[1].Detail["requested"])
	require.Equal(t, 0, entries[2].Count)
	require.Equal(t, 1, entries[3].Count)
	require.Equal(t, map[string]any{"all": true, "credential": "default"}, entries[3].Detail)
}

// batchFileRows returns the file ids of provider_batch_files, sorted.
func (b *jobsBundle) batchFileRows(t *testing.T) []string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), `SELECT file_id FROM provider_batch_files ORDER BY file_id`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return ids
}

// TestBatchFiles_ForgetRemovesTheRows: `ctl batch files forget FILE_ID...` removes the named
// files' rows (given up or not; of --credential), without a call to the provider, says how many,
// names those it did not find (exit 1) and writes one audit entry a run; no id, or an empty one,
// is a usage error (exit 2). Before, nothing removed a given-up row an operator had deleted by
// hand.
func TestBatchFiles_ForgetRemovesTheRows(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url}
	b.seedThreeFiles(t)

	requireOneLineError(t, run(t, append(db, "batch", "files", "forget")...), 2, "usage: ctl batch files forget")
	requireOneLineError(t, run(t, append(db, "batch", "files", "forget", "file-a", "")...), 2, "empty file id")
	requireOneLineError(t, run(t, append(db, "batch", "files", "forget", "--all")...), 2, "flag provided but not defined")
	require.Equal(t, []string{"file-a", "file-b", "file-c"}, b.batchFileRows(t), "a usage error changed rows")

	requireOneLineError(t, run(t, append(db, "batch", "files", "forget", "file-a", "--credential", "backup")...), 1,
		`no batch file "file-a" of credential "backup"`)

	r := run(t, append(db, "batch", "files", "forget", "file-a", "file-c", "file-x")...)
	require.Equal(t, 1, r.code)
	require.Equal(t, "forgot 2 batch files: their rows are removed, the files left as they are at the provider\n", r.out)
	require.Equal(t, "ctl: no batch file \"file-x\"\n", r.errOut)
	require.Equal(t, []string{"file-b"}, b.batchFileRows(t))

	r = run(t, append(db, "batch", "files", "forget", "--credential", "backup", "file-b")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "forgot 1 batch file: its row is removed, the file left as it is at the provider\n", r.out)
	require.Empty(t, b.batchFileRows(t))

	entries := auditLog(t, b.url)
	require.Len(t, entries, 3, "one entry a run that asked for something")
	require.Equal(t, "batch_file.forget", entries[0].Action)
	require.Equal(t, 1, entries[0].Count)
	require.Equal(t, map[string]any{"requested": []any{"file-b"}, "credential": "backup"}, entries[0].Detail)
	require.Equal(t, 2, entries[1].Count)
	require.Equal(t, []any{"file-a", "file-c", "file-x"}, entries[1].Detail["requested"])
	require.Equal(t, 0, entries[2].Count)
}

// TestBatchFiles_WarnsOfCredentialsNotConfigured: with --config, `ctl batch files` and `retry`
// warn on the error output (exit 0) when files they list or reset belong to a credential the
// config does not have: no worker of that config deletes them. Without --config, or with every
// credential configured, nothing is said. The warning counts files and credentials in the
// singular when there is one.
func TestBatchFiles_WarnsOfCredentialsNotConfigured(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	cfg := []string{"--config", configFile(t, b.url, "default", "openai")}
	b.seedBatchFiles(t,
		batchFileRow{credential: "default", id: "file-a", kind: "ended", attempts: 10, lastError: "500"},
		batchFileRow{credential: "removed", id: "file-b", kind: "ended", attempts: 10, lastError: "500"},
		batchFileRow{credential: "gone", id: "file-c", kind: "ended"},
		batchFileRow{credential: "removed", id: "file-d", kind: "upload"},
	)

	r := run(t, append(cfg, "batch", "files")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Len(t, tableRows(r.out), 5, r.out)
	require.Equal(t, "ctl: warning: 3 of these batch files belong to credentials not in the config (gone, removed): "+
		"no worker of it deletes them; delete them at the provider by hand, then `ctl batch files forget` them\n", r.errOut)

	r = run(t, append(cfg, "batch", "files", "--credential", "removed")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "ctl: warning: 2 of these batch files belong to a credential not in the config (removed): "+
		"no worker of it deletes them; delete them at the provider by hand, then `ctl batch files forget` them\n", r.errOut)

	r = run(t, "--database-url", b.url, "batch", "files")
	require.Equal(t, 0, r.code, r.errOut)
	require.Empty(t, r.errOut, "without --config the configured credentials are unknown")

	r = run(t, append(cfg, "batch", "files", "--credential", "default")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Empty(t, r.errOut)

	r = run(t, append(cfg, "batch", "files", "retry", "--all")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "put 2 batch files back in line: the batch lane's leader deletes them in its next pass\n", r.out)
	require.Equal(t, "ctl: warning: 1 of these batch files belongs to a credential not in the config (removed): "+
		"no worker of it deletes it; delete it at the provider by hand, then `ctl batch files forget` it\n", r.errOut)
}
