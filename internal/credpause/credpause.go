// Package credpause keeps credential pauses (a spend cap: a 429 without Retry-After) in Postgres,
// the source of truth, beside their fast copy in Redis (the limiter's pause hash, which every
// admission reads). A pause lost by Redis (a restart without persistence, a flush) is written back
// from its row before the credential sends again: the executor restores it when its admission
// finds Redis holding no pause state (limiter.Reservation.PauseUnknown), and the worker's pause
// refresh when it reads none.
package credpause

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/limiter"
)

// ErrDatabase marks the errors that come from Postgres rather than from Redis.
var ErrDatabase = errors.New("postgres")

// Store is the credential_pauses table (migration 020) and the Redis copy it keeps in step. It
// is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	now  func() time.Time
}

// NewStore returns a Store on a migrated pool. now is the clock a new pause's start is read on;
// nil means time.Now.
func NewStore(pool *pgxpool.Pool, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{pool: pool, now: now}
}

// Pause pauses the credential behind g until Resume: in Postgres first, then in Redis (see
// limiter.Gate.Pause), which is tried even when Postgres fails. started is true only for the
// call that began the episode in Postgres (in Redis when Postgres failed), so that the caller
// alerts once per episode, also when Redis lost the pause and a later answer pauses it again;
// it may be true beside an error. Errors are wrapped Redis errors, or database errors (matching
// ErrDatabase).
func (s *Store) Pause(ctx context.Context, g *limiter.Gate, reason, jobID string) (started bool, err error) {
	var since time.Time
	perr := s.pool.QueryRow(ctx, `
INSERT INTO credential_pauses (tag, credential, since, reason, first_job_id) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tag) DO NOTHING
RETURNING since`, g.Tag(), g.Name(), s.now(), reason, jobID).Scan(&since)
	inserted := perr == nil
	if errors.Is(perr, pgx.ErrNoRows) {
		perr = nil
	}
	redisStarted, rerr := g.Pause(ctx, reason, jobID)
	if perr != nil {
		return redisStarted && rerr == nil, errors.Join(fmt.Errorf("record credential pause: %w: %w", ErrDatabase, perr), rerr)
	}
	return inserted, rerr
}

// Resume ends the credential's pause, if any: in Postgres first (a failure there changes
// nothing: a pause resumed in Redis only would come back with Redis's next loss), then in Redis.
// It reports whether the credential was paused in either. Errors are wrapped Redis errors, or
// database errors (matching ErrDatabase).
func (s *Store) Resume(ctx context.Context, g *limiter.Gate) (bool, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM credential_pauses WHERE tag = $1`, g.Tag())
	if err != nil {
		return false, fmt.Errorf("resume credential: %w: %w", ErrDatabase, err)
	}
	was, err := g.Resume(ctx)
	return was || tag.RowsAffected() > 0, err
}

// Get returns the credential's pause as Postgres keeps it (Paused false: not paused). Errors
// match ErrDatabase.
func (s *Store) Get(ctx context.Context, g *limiter.Gate) (limiter.PauseState, error) {
	var ps limiter.PauseState
	err := s.pool.QueryRow(ctx, `SELECT since, reason, first_job_id FROM credential_pauses WHERE tag = $1`,
		g.Tag()).Scan(&ps.Since, &ps.Reason, &ps.FirstJobID)
	if errors.Is(err, pgx.ErrNoRows) {
		return limiter.PauseState{}, nil
	}
	if err != nil {
		return limiter.PauseState{}, fmt.Errorf("read credential pause: %w: %w", ErrDatabase, err)
	}
	ps.Paused = true
	return ps, nil
}

// Restore writes the credential's pause state as Postgres keeps it into Redis when Redis holds
// none (limiter.PauseState.Unknown; see limiter.Gate.RestorePause): a pause or resume Redis
// holds, made since the read, stays. It returns the state Postgres keeps and whether Redis took
// it. Errors are Get's, or wrapped Redis errors.
func (s *Store) Restore(ctx context.Context, g *limiter.Gate) (limiter.PauseState, bool, error) {
	ps, err := s.Get(ctx, g)
	if err != nil {
		return ps, false, err
	}
	restored, err := g.RestorePause(ctx, ps)
	return ps, restored, err
}
