package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Unfinished is a non-terminal job as the sweeper sees it.
type Unfinished struct {
	ID            string
	Status        Status
	NextAttemptAt *time.Time
	// LeaseUntil is when the running attempt's lease ends (nil: no lease).
	LeaseUntil *time.Time
	// Priority names the asynq queue of the job's task.
	Priority Priority
	// Attempts is how many attempts have started; CreatedAt is when the job was created.
	Attempts  int
	CreatedAt time.Time
	// ReadAt is Postgres's clock when the row was read, the clock LeaseUntil and CreatedAt are
	// on: Leased and Fresh measure on it, so that a reader whose host clock is off from the
	// database's neither takes a live lease for an ended one nor the reverse.
	ReadAt time.Time
}

// Leased reports whether a live attempt lease held the job when it was read (its delivery is
// alive).
func (u Unfinished) Leased() bool {
	return u.Status == StatusRunning && u.LeaseUntil != nil && u.LeaseUntil.After(u.ReadAt)
}

// Fresh reports whether the job, when read, was created less than grace before and had not been
// tried or deferred: its first delivery may be running in the process that created it, with no
// task (dispatch.Handoff).
func (u Unfinished) Fresh(grace time.Duration) bool {
	return u.Status == StatusQueued && u.Attempts == 0 && u.NextAttemptAt == nil && u.ReadAt.Sub(u.CreatedAt) < grace
}

// UnfinishedByID returns those of the jobs ids that are not terminal (malformed and unknown IDs
// are left out), in no particular order.
func (s *Store) UnfinishedByID(ctx context.Context, ids []string) ([]Unfinished, error) {
	valid := make([]string, 0, len(ids))
	for _, id := range ids {
		if ValidID(id) {
			valid = append(valid, id)
		}
	}
	if len(valid) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT `+unfinishedColumns+` FROM jobs
WHERE id = ANY($1::uuid[]) AND status IN ('queued', 'running', 'retrying')`, valid)
	if err != nil {
		return nil, fmt.Errorf("read unfinished jobs: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanUnfinished)
	if err != nil {
		return nil, fmt.Errorf("read unfinished jobs: %w", err)
	}
	return out, nil
}

// unfinishedColumns are the columns scanUnfinished reads.
const unfinishedColumns = `id::text, status, next_attempt_at, lease_until, priority, attempts, created_at,
	clock_timestamp()`

// scanUnfinished reads a row of unfinishedColumns.
func scanUnfinished(r pgx.CollectableRow) (Unfinished, error) {
	var u Unfinished
	err := r.Scan(&u.ID, &u.Status, &u.NextAttemptAt, &u.LeaseUntil, &u.Priority, &u.Attempts, &u.CreatedAt, &u.ReadAt)
	return u, err
}

// ListUnfinished returns up to limit non-terminal online-lane jobs with IDs after `after`, in ID
// order (keyset pagination: each page costs the same however large the table). Batch-lane jobs
// have no task to miss: the batcher holds them.
func (s *Store) ListUnfinished(ctx context.Context, after string, limit int) ([]Unfinished, error) {
	if after == "" {
		after = uuid.Nil.String()
	}
	var out []Unfinished
	err := s.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, listUnfinishedSQL, after, limit)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanUnfinished)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list unfinished jobs: %w", err)
	}
	return out, nil
}

// listUnfinishedSQL is one page of ListUnfinished: it must read jobs_unfinished_online_idx in
// order from $1 and stop after $2 rows, or every page costs the whole backlog (a sweep of N
// unfinished jobs then costs N²/500). Three things broke that before: ORDER BY id named the text
// output column (id::text), which no index orders, so each page sorted every unfinished job;
// without table statistics the planner picked a bitmap scan and a sort (see inOrderOfIndex);
// and the index held the batch lane's jobs too, which every pass read to leave out.
const listUnfinishedSQL = `
SELECT ` + unfinishedColumns + ` FROM jobs
WHERE status IN ('queued', 'running', 'retrying') AND id > $1 AND lane = 'online'
ORDER BY jobs.id LIMIT $2`

// inOrderOfIndex runs fn in a transaction whose statements may not sort: for the statements
// that take the first rows of an index in its order and stop at a LIMIT (ListUnfinished,
// FailOverdue, DeleteFinished). Without table statistics (a fresh database, or autovacuum off
// as on our test machines) the planner estimates a handful of rows and picks a bitmap scan and
// a sort, which reads every matching row however small the LIMIT.
func (s *Store) inOrderOfIndex(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, noSortSettings); err != nil {
			return err
		}
		return fn(tx)
	})
}

const noSortSettings = `SET LOCAL enable_sort = off`
