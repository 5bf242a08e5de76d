package batchlane

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// File is a file the batch lane keeps at a provider and has not deleted yet (a row of
// provider_batch_files), as the operator sees it.
type File struct {
	Credential string `json:"credential"`
	ID         string `json:"file_id"`
	// Batch is the provider_batches row the file belongs to (which retention may have deleted).
	Batch string `json:"batch"`
	// Kind is upload (uploaded by a send) or ended (listed by the ended batch).
	Kind string `json:"kind"`
	// Released marks an upload no batch reads, deleted without waiting for its batch's close.
	Released bool `json:"released"`
	// Attempts is how many deletes of the file failed.
	Attempts int `json:"attempts"`
	// GivenUp marks a file whose deletes ran out of attempts: left at the provider until an
	// operator retries it (RetryFiles), or deletes it there by hand and forgets it (ForgetFiles).
	GivenUp bool `json:"given_up"`
	// NextTry is when the leader's pass may try its delete next: nil when due at once (no delete
	// failed yet, or retried by RetryFiles) or given up. A file is deleted only once its batch
	// is closed, whatever NextTry says.
	NextTry *time.Time `json:"next_try_at"`
	// LastError is the error of its last failed delete; nil when none failed.
	LastError *string   `json:"last_error"`
	CreatedAt time.Time `json:"created_at"`
}

// FilesFilter selects the files ListFiles returns.
type FilesFilter struct {
	// Credential keeps one credential's files ("": every credential's).
	Credential string
	// GivenUp keeps the given-up files only.
	GivenUp bool
	// Limit bounds how many (0: 100).
	Limit int
}

// ListFiles returns the files of f not deleted yet: the given-up ones first, then the newest
// recorded first.
func ListFiles(ctx context.Context, pool *pgxpool.Pool, f FilesFilter) ([]File, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	// next_try_at is -infinity until a delete failed (see migration 024), which time.Time
	// cannot hold: NULL, as for a file given up.
	rows, err := pool.Query(ctx, `SELECT credential, file_id, batch::text, kind, released, attempts,
	attempts >= $3 AS given_up,
	CASE WHEN attempts >= $3 OR next_try_at = '-infinity' THEN NULL ELSE next_try_at END,
	last_error, created_at
FROM provider_batch_files
WHERE ($1 = '' OR credential = $1) AND (NOT $2 OR attempts >= $3)
ORDER BY attempts >= $3 DESC, created_at DESC, credential, file_id
LIMIT $4`, f.Credential, f.GivenUp, maxFileDeleteAttempts, f.Limit)
	if err != nil {
		return nil, fmt.Errorf("list batch files: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (f File, err error) {
		err = r.Scan(&f.Credential, &f.ID, &f.Batch, &f.Kind, &f.Released, &f.Attempts, &f.GivenUp,
			&f.NextTry, &f.LastError, &f.CreatedAt)
		return f, err
	})
	if err != nil {
		return nil, fmt.Errorf("list batch files: %w", err)
	}
	return out, nil
}

// RetryFilesParams selects the files RetryFiles puts back in line.
type RetryFilesParams struct {
	// All selects every given-up file; IDs, when All is false, the files of these ids, given up
	// or not.
	All bool
	IDs []string
	// Credential keeps one credential's files ("": every credential's).
	Credential string
}

// RetryFiles puts the files of p back in line for their delete: no attempts, due at once (as a
// file no delete failed for, so that the leader's clock need not agree with the database's),
// their last error kept until the next delete. The leader's next pass deletes those whose batch
// is closed. It returns the files it changed (credential and file id set).
func RetryFiles(ctx context.Context, pool *pgxpool.Pool, p RetryFilesParams) ([]File, error) {
	ids := p.IDs
	if p.All || ids == nil {
		ids = []string{}
	}
	out, err := changeFiles(ctx, pool, `UPDATE provider_batch_files SET attempts = 0, next_try_at = '-infinity'
WHERE ($1 = '' OR credential = $1) AND CASE WHEN $2 THEN attempts >= $3 ELSE file_id = ANY($4) END
RETURNING credential, file_id`, p.Credential, p.All, maxFileDeleteAttempts, ids)
	if err != nil {
		return nil, fmt.Errorf("retry batch files: %w", err)
	}
	return out, nil
}

// ForgetFiles removes the rows of the files ids (of credential; "": any credential's), given up
// or not, without deleting them at the provider: for files an operator deleted there by hand
// (or means to leave there), whose rows the leader would otherwise keep (given up) or try to
// delete again. An upload still at the provider whose batch's row is kept is recorded again by
// the leader's next listing (see Batcher.adoptUploads), and deleted. It returns the files it
// removed (credential and file id set).
func ForgetFiles(ctx context.Context, pool *pgxpool.Pool, credential string, ids []string) ([]File, error) {
	if ids == nil {
		ids = []string{}
	}
	out, err := changeFiles(ctx, pool, `DELETE FROM provider_batch_files
WHERE ($1 = '' OR credential = $1) AND file_id = ANY($2)
RETURNING credential, file_id`, credential, ids)
	if err != nil {
		return nil, fmt.Errorf("forget batch files: %w", err)
	}
	return out, nil
}

// changeFiles runs query, which changes rows of provider_batch_files and returns their
// credential and file_id, and returns those files.
func changeFiles(ctx context.Context, pool *pgxpool.Pool, query string, args ...any) ([]File, error) {
	rows, err := pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (f File, err error) {
		err = r.Scan(&f.Credential, &f.ID)
		return f, err
	})
}
