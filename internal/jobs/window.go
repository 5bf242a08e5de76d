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
	var since time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`,
		window.Microseconds()).Scan(&since); err != nil {
		return nil, fmt.Errorf("start of the window: %w", err)
	}
	return s.Stats(ctx, since)
}
