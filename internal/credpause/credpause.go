// Package credpause keeps credential pauses (a spend cap: a 429 without Retry-After) in Postgres,
// the source of truth, beside their fast copy in Redis (the limiter's pause hash, which every
// admission reads). A pause lost by Redis (a restart without persistence, a flush) is written back
// from its row before the credential sends again: the executor restores it when its admission
// finds Redis holding no pause state (limiter.Reservation.PauseUnknown), and the worker's pause
// refresh when it reads none. PauseSpendCap is how both lanes, online (the executor) and batch,
// pause a credential after a spend-cap answer and alert on it.
package credpause

import (
	"context"
	"errors"
	"fmt"
	"sync"
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

	mu    sync.Mutex
	turns map[string]chan struct{} // per credential tag: the process's turn at its lock (see lock)
}

// NewStore returns a Store on a migrated pool. now is the clock a new pause's start is read on;
// nil means time.Now.
func NewStore(pool *pgxpool.Pool, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{pool: pool, now: now, turns: map[string]chan struct{}{}}
}

// Pause pauses the credential behind g until Resume: in Postgres first, then in Redis (see
// limiter.Gate.PauseSince) with the row's start and first job, so that both hold one episode
// whichever caller reaches Redis first; Redis is tried even when Postgres fails. started is
// true only for the call that began the episode in Postgres (in Redis when Postgres failed), so
// that the caller alerts once per episode, also when Redis lost the pause and a later answer
// pauses it again; a pause Redis held before the row was written (its insert failed, or it
// predates the table) began the episode then, and the insert that keeps it now starts nothing.
// A row whose pause Redis holds as resumed (a resume in Redis alone, by the last release's ctl,
// console or pause probe during a rolling upgrade) is an episode that ended: the call that
// begins the next one in Redis replaces it, and is started. started may be true beside an
// error. Errors are wrapped Redis errors, or, when only Postgres failed (Redis holds the pause),
// a database error (matching ErrDatabase). It holds the credential's lock (see lock) throughout.
func (s *Store) Pause(ctx context.Context, g *limiter.Gate, reason, jobID string) (started bool, err error) {
	var row limiter.PauseState
	var inserted bool
	fresh := limiter.PauseState{Paused: true, Since: s.now(), Reason: reason, FirstJobID: jobID}
	conn, unlock, perr := s.lock(ctx, g)
	if perr == nil {
		defer unlock()
		// DO UPDATE rather than DO NOTHING: the row is returned to every caller, also one that
		// conflicted with an insert committed after its statement began.
		perr = conn.QueryRow(ctx, `
INSERT INTO credential_pauses (tag, credential, since, reason, first_job_id) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tag) DO UPDATE SET tag = EXCLUDED.tag
RETURNING since, reason, first_job_id, xmax = 0`, g.Tag(), g.Name(), fresh.Since, reason, jobID).Scan(
			&row.Since, &row.Reason, &row.FirstJobID, &inserted)
	}
	if perr != nil {
		// The Redis pause is what stops the sends: made also when Postgres's side used up ctx (a
		// lock another process holds, a slow or silent server), on a bound of its own. On ctx,
		// ended by then, the credential was paused nowhere until the next spend cap's answer.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), redisFallbackTimeout)
		defer cancel()
		redisStarted, rerr := g.Pause(rctx, reason, jobID)
		if rerr != nil {
			return false, fmt.Errorf("%w (nor was it recorded in postgres: %v)", rerr, perr)
		}
		return redisStarted, fmt.Errorf("record credential pause: %w: %w", ErrDatabase, perr)
	}
	redisStarted, known, err := g.PauseSince(ctx, row, fresh)
	if err == nil && redisStarted && known && !inserted {
		// Redis held the credential as resumed: the row's episode had ended, and Redis began
		// this one (fresh), which the row now keeps.
		if _, err := conn.Exec(ctx, `
INSERT INTO credential_pauses (tag, credential, since, reason, first_job_id) VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (tag) DO UPDATE SET credential = $2, since = $3, reason = $4, first_job_id = $5`,
			g.Tag(), g.Name(), fresh.Since, reason, jobID); err != nil {
			return true, fmt.Errorf("replace ended credential pause: %w: %w", ErrDatabase, err)
		}
		return true, nil
	}
	if err != nil || !inserted || redisStarted {
		return inserted, err
	}
	// Redis was paused already: by this row's episode (another caller of it, or a restore, got
	// there first), or by one that began without the row, which alerted then.
	ps, err := g.Paused(ctx)
	if err != nil {
		return true, err
	}
	return !ps.Paused || ps.Since.UnixMicro() == row.Since.UnixMicro(), nil
}

// Resume ends the credential's pause, if any: in Postgres first (a failure there changes
// nothing: a pause resumed in Redis only would come back with Redis's next loss), then in Redis.
// It reports whether the credential was paused in either. Errors are wrapped Redis errors, or
// database errors (matching ErrDatabase). It holds the credential's lock (see lock) throughout.
func (s *Store) Resume(ctx context.Context, g *limiter.Gate) (bool, error) {
	conn, unlock, err := s.lock(ctx, g)
	if err != nil {
		return false, fmt.Errorf("resume credential: %w: %w", ErrDatabase, err)
	}
	defer unlock()
	tag, err := conn.Exec(ctx, `DELETE FROM credential_pauses WHERE tag = $1`, g.Tag())
	if err != nil {
		return false, fmt.Errorf("resume credential: %w: %w", ErrDatabase, err)
	}
	was, err := g.Resume(ctx)
	return was || tag.RowsAffected() > 0, err
}

// lockClass is the first key of the credentials' pause locks ("lqps"), the second a hash of the
// credential's tag: Postgres keeps two-key advisory locks apart from one-key ones (migrations,
// leader elections).
const lockClass int32 = 0x6c717073

// lock takes the credential's pause lock, a session-level Postgres advisory lock on its tag, on
// a connection of its own, and returns the connection (for the caller's statements) and the
// unlock, which gives both back. Pause and Resume hold it across their writes to Postgres and to
// Redis, so that two of them on one credential, in any processes, write both stores one after
// the other: interleaved, a resume between a pause's row and its Redis write left Redis paused
// and no row (the console showed a pause that Redis losing its data would end by itself), and
// a pause between a resume's delete and its Redis write left the row with Redis resumed (the
// next restore paused the credential again). A connection whose unlock fails is closed, which
// ends the lock with its session.
//
// The store's callers on one credential take their turn in the process first, without a
// connection: a burst of spend-cap answers (a worker's every delivery on the key) waits on one
// connection, not on the whole pool, which the deliveries of every other credential need.
func (s *Store) lock(ctx context.Context, g *limiter.Gate) (*pgxpool.Conn, func(), error) {
	turn := s.turn(g.Tag())
	select {
	case turn <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, fmt.Errorf("lock credential pause: %w", context.Cause(ctx))
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		<-turn
		return nil, nil, fmt.Errorf("lock credential pause: %w", err)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockClass, g.Tag()); err != nil {
		conn.Release()
		<-turn
		return nil, nil, fmt.Errorf("lock credential pause: %w", err)
	}
	unlock := func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unlockTimeout)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, lockClass, g.Tag()); err != nil {
			_ = conn.Conn().Close(uctx)
		}
		conn.Release()
		<-turn
	}
	return conn, unlock, nil
}

// turn returns the credential's turn in this process (see lock): a channel that holds one
// caller at a time.
func (s *Store) turn(tag string) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.turns[tag]
	if !ok {
		t = make(chan struct{}, 1)
		s.turns[tag] = t
	}
	return t
}

// unlockTimeout bounds the unlock of a credential's pause lock, past which its connection is
// closed instead.
const unlockTimeout = 5 * time.Second

// redisFallbackTimeout bounds Pause's Redis pause when Postgres's side failed: far above what a
// healthy Redis takes (its socket timeouts are 5 s too).
const redisFallbackTimeout = 5 * time.Second

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

// Reconcile writes the credential's pause as Postgres keeps it into a Redis that holds the
// credential as not paused although the episode never ended there: Redis lost it in a failover
// (a replica that had not received the pause took over), or the pause never reached Redis (see
// limiter.Gate.RestoreLostPause). Restore covers a Redis that lost every key; this covers one
// that lost the last moments' writes, which a pause is. It reads Postgres once, and takes the
// credential's lock (see lock) only when a pause is kept, so that a resume cannot end the
// episode between its read and its write. It reports whether Redis took the pause. Errors are
// Get's, the lock's (matching ErrDatabase), or wrapped Redis errors.
func (s *Store) Reconcile(ctx context.Context, g *limiter.Gate) (bool, error) {
	ps, err := s.Get(ctx, g)
	if err != nil || !ps.Paused {
		return false, err
	}
	conn, unlock, err := s.lock(ctx, g)
	if err != nil {
		return false, fmt.Errorf("reconcile credential pause: %w: %w", ErrDatabase, err)
	}
	defer unlock()
	err = conn.QueryRow(ctx, `SELECT since, reason, first_job_id FROM credential_pauses WHERE tag = $1`,
		g.Tag()).Scan(&ps.Since, &ps.Reason, &ps.FirstJobID)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // resumed meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("read credential pause: %w: %w", ErrDatabase, err)
	}
	return g.RestoreLostPause(ctx, ps)
}
