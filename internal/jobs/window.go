package jobs

import (
	"context"
	"fmt"
	"time"
)

// WindowStats is Stats over the window that ends now on Postgres's clock, the clock that wrote
// the jobs' created_at and finished_at. Its Since is on that clock. The caller's clock takes no
// part: a host off by X (an API host's console, an operator's laptop running ctl) would count
// the window's ends and submits as of X later or earlier. The attempts' started_at are the
// workers' clocks (jobs.Attempt.StartedAt): a worker off by X still shifts its attempts by X.
func (s *Store) WindowStats(ctx context.Context, window time.Duration) (*Stats, error) {
	since, err := s.Ago(ctx, window)
	if err != nil {
		return nil, fmt.Errorf("start of the window: %w", err)
	}
	return s.Stats(ctx, since)
}

// Ago is the instant d before now on Postgres's clock, the clock that wrote the jobs'
// created_at and finished_at: a cutoff compared with them (ctl dead list --since, ctl dead
// purge --older-than) taken from the caller's clock would move by the caller's offset.
func (s *Store) Ago(ctx context.Context, d time.Duration) (time.Time, error) {
	var t time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`,
		d.Microseconds()).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("the database's time %s ago: %w", d, err)
	}
	return t, nil
}
