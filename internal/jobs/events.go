package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	if !ValidID(id) {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, eventsSQL, id, after)
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	return scanEvents(rows)
}

// watchSQL is Watch's statement: $1 the job, $2 the TTL in milliseconds.
const watchSQL = `
INSERT INTO job_watches (job_id, expires_at)
SELECT id, clock_timestamp() + $2 * interval '1 millisecond' FROM jobs WHERE id = $1 FOR SHARE
ON CONFLICT (job_id) DO UPDATE SET expires_at = greatest(job_watches.expires_at, excluded.expires_at)`

// eventsSQL is Events's statement: $1 the job, $2 the sequence number to read after.
const eventsSQL = `
SELECT seq, type, payload, created_at FROM job_events WHERE job_id = $1 AND seq > $2 ORDER BY seq`

// scanEvents reads eventsSQL's rows.
func scanEvents(rows pgx.Rows) ([]Event, error) {
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
	_, err := s.pool.Exec(ctx, watchSQL, id, ttl.Milliseconds())
	if err != nil {
		return fmt.Errorf("watch job events: %w", err)
	}
	return nil
}

// watchLatestSQL is WatchLatest's statement: watchSQL that also returns the job's latest event's
// sequence number, as the share lock found it. $1 the job, $2 the TTL in milliseconds.
const watchLatestSQL = `
WITH job AS (SELECT id, event_seq FROM jobs WHERE id = $1 FOR SHARE),
watch AS (
	INSERT INTO job_watches (job_id, expires_at)
	SELECT id, clock_timestamp() + $2 * interval '1 millisecond' FROM job
	ON CONFLICT (job_id) DO UPDATE SET expires_at = greatest(job_watches.expires_at, excluded.expires_at))
SELECT event_seq FROM job`

// WatchLatest is Watch, returning also the sequence number of the job's latest event committed
// when the watch took effect, in the same statement: an event stream's keep-alive renews its
// watch with it, and reads the job's events only when an event it has not read exists (one whose
// notification was lost), instead of reading them at every keep-alive. Watch's guarantee holds:
// every event past seq is announced. It returns ErrNotFound for a job that does not exist (or a
// malformed ID).
func (s *Store) WatchLatest(ctx context.Context, id string, ttl time.Duration) (seq int, err error) {
	if !ValidID(id) {
		return 0, ErrNotFound
	}
	if err := s.pool.QueryRow(ctx, watchLatestSQL, id, ttl.Milliseconds()).Scan(&seq); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, ErrNotFound
		}
		return 0, fmt.Errorf("watch job events: %w", err)
	}
	return seq, nil
}

// WatchAndRead is Watch, then Events after seq after, then GetWithoutRequest (the job has no
// Request), in one round trip: what an event stream does when it opens. The three statements run in one transaction (a pipelined batch),
// each with its own snapshot, so Watch's guarantee holds for the reads as if they followed its
// commit: a transition committed before the watch took the job's row is read; one that comes
// after waits for the watch's commit and is announced. It returns ErrNotFound for a job that
// does not exist (or a malformed ID).
func (s *Store) WatchAndRead(ctx context.Context, id string, ttl time.Duration, after int) ([]Event, *Job, error) {
	if !ValidID(id) {
		return nil, nil, ErrNotFound
	}
	var b pgx.Batch
	b.Queue(watchSQL, id, ttl.Milliseconds())
	b.Queue(eventsSQL, id, after)
	b.Queue(`SELECT `+jobColumnsNoRequest+` FROM jobs WHERE id = $1`, id)
	br := s.pool.SendBatch(ctx, &b)
	evs, job, err := s.readWatchBatch(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if errors.Is(err, ErrNotFound) {
		return nil, nil, ErrNotFound
	}
	if err != nil {
		return nil, nil, fmt.Errorf("watch and read job events: %w", err)
	}
	return evs, job, nil
}

// readWatchBatch reads WatchAndRead's three answers.
func (s *Store) readWatchBatch(br pgx.BatchResults) ([]Event, *Job, error) {
	if _, err := br.Exec(); err != nil {
		return nil, nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, nil, err
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, nil, err
	}
	job, err := s.scanJob(br.QueryRow())
	if err != nil {
		return nil, nil, err
	}
	return evs, job, nil
}

// streamHeadSQL is GetForStream's statement: the job's columns without its request and its
// result, then whether its request's top-level member "stream" is the JSON literal true. The
// request is stored as json (its text): Postgres's -> takes the last member of a name, matched
// with its escapes decoded and its case kept, and gives a scalar's text without the white space
// around it, as encoding/json reads a body into a map. $1 the job.
const streamHeadSQL = `SELECT ` + jobColumnsNoPayload + `,
	coalesce((request->'stream')::text = 'true', false) FROM jobs WHERE id = $1`

// GetForStream returns the job without its request and its result (both nil), and whether its
// request asks the provider to stream, as requested (deltastream.Requested) answers of the
// request: what an event stream needs of its job as it opens. Postgres answers the question:
// the request (up to api.max_body_bytes) and the result are not read, which each stream's
// opening did before. A request Postgres cannot turn into text (\u0000, an unpaired surrogate
// escape: submits refuse them, but an earlier release stored them) fails the statement; the
// job is then read as Get reads it and requested asks of its request, which the job then holds.
// It returns ErrNotFound for a job that does not exist (or a malformed ID).
func (s *Store) GetForStream(ctx context.Context, id string, requested func([]byte) bool) (job *Job, streams bool, err error) {
	if !ValidID(id) {
		return nil, false, ErrNotFound
	}
	job, err = s.scanJob(s.pool.QueryRow(ctx, streamHeadSQL, id), &streams)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && strings.HasPrefix(pgErr.Code, "22") {
		if job, err = s.Get(ctx, id); err != nil {
			return nil, false, err
		}
		return job, requested(job.Request), nil
	}
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, false, ErrNotFound
	case err != nil:
		return nil, false, fmt.Errorf("get job for its stream: %w", err)
	}
	return job, streams, nil
}

// PruneWatches deletes the watches that ended more than a minute ago (the sweeper calls it).
func (s *Store) PruneWatches(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM job_watches WHERE expires_at < now() - interval '1 minute'`); err != nil {
		return fmt.Errorf("prune event watches: %w", err)
	}
	return nil
}
