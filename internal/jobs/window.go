package jobs

import (
	"context"
	"fmt"
	"time"
)

// Ago is the instant d before now on Postgres's clock, the clock that wrote the jobs'
// created_at and finished_at: a cutoff compared with them (ctl dead list --since, ctl dead
// purge --older-than) taken from the caller's clock would move by the caller's offset.
func (s *Store) Ago(ctx context.Context, d time.Duration) (time.Time, error) {
	var t time.Time
	if err := s.pool.QueryRow(ctx, `SELECT `+agoSQL,
		d.Microseconds()).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("the database's time %s ago: %w", d, err)
	}
	return t, nil
}

// agoSQL is, in SQL, the instant $1 microseconds (a bigint) before now() on Postgres's clock (Ago,
// Stats). now() is the transaction's start: every use in a statement is the same instant. It is a
// stable expression, which the planner folds to estimate a condition on it, as a parameter.
const agoSQL = `(now() - $1::bigint * interval '1 microsecond')`
