package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Event is one stored transition of a job: the job entered status Type. Seq numbers a job's
// events 1, 2, 3, ... without gaps, in commit order (every transition bumps jobs.event_seq under
// the row lock, so a later transition cannot commit before an earlier one).
type Event struct {
	Seq       int             `json:"seq"`
	Type      Status          `json:"type"`
	Payload   json.RawMessage `json:"payload"`
	CreatedAt time.Time       `json:"created_at"`
}

// Events returns the job's events with a sequence number above after, in order. A job without
// such events (or without any, or an unknown or malformed ID) yields none and no error: callers
// check the job itself first.
func (s *Store) Events(ctx context.Context, id string, after int) ([]Event, error) {
	if !validID(id) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, `
SELECT seq, type, payload, created_at FROM job_events WHERE job_id = $1 AND seq > $2 ORDER BY seq`, id, after)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Event, error) {
		var e Event
		err := r.Scan(&e.Seq, &e.Type, &e.Payload, &e.CreatedAt)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return out, nil
}

// Watch makes the job's transitions announced on EventsChannel for ttl from now (a trigger
// notifies only for watched jobs: NOTIFY serializes commits, so unwatched transitions skip it).
// An event stream calls it before its first read and again before ttl runs out; a stream that
// ends simply stops renewing. Watching a job that does not exist is a no-op.
//
// When Watch returns, every transition of the job is either committed (a read sees it) or will
// be announced: the watch takes a share lock on the job's row, which every transition updates.
// A transition whose statement ran first holds the row until it commits, so Watch waits for
// that commit; one that comes later waits for the watch's commit, and its notify trigger then
// sees the watch. Without the lock, a transition that checked for watches before the watch
// committed, and committed after the stream's read, was neither announced nor read.
func (s *Store) Watch(ctx context.Context, id string, ttl time.Duration) error {
	_, err := s.pool.Exec(ctx, `
INSERT INTO job_watches (job_id, expires_at)
SELECT id, clock_timestamp() + $2 * interval '1 millisecond' FROM jobs WHERE id = $1 FOR SHARE
ON CONFLICT (job_id) DO UPDATE SET expires_at = greatest(job_watches.expires_at, excluded.expires_at)`,
		id, ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("watch job events: %w", err)
	}
	return nil
}

// PruneWatches deletes the watches that ended more than a minute ago (the sweeper calls it).
func (s *Store) PruneWatches(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM job_watches WHERE expires_at < now() - interval '1 minute'`); err != nil {
		return fmt.Errorf("prune event watches: %w", err)
	}
	return nil
}
