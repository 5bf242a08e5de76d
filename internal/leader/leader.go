// Package leader elects one process among many for a background duty, with a Postgres
// session-level advisory lock: the process whose connection holds the lock leads; one that dies,
// or whose connection breaks, releases it with its session, and another takes it on its next try.
package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// Run tries to lead (see Lead) every interval, the first time one interval after it starts, until
// ctx ends; report is told each try's outcome (nil: it led without error, or another process
// leads), and nil as this process begins to lead too: a run of failed tries is over then, though
// the try's outcome comes only when it stops leading, perhaps days later. It returns when ctx
// ends. leading (nil: none; see Metrics.Duty) is 1 while fn runs, from the moment it begins to
// lead until fn has returned (its lead lost, failed or ended with ctx), and 0 otherwise.
func Run(ctx context.Context, pool *pgxpool.Pool, key int64, interval time.Duration, leading prometheus.Gauge,
	fn func(context.Context) error, report func(error)) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	lead := func(ctx context.Context) error {
		if leading != nil {
			leading.Set(1)
			defer leading.Set(0)
		}
		report(nil)
		return fn(ctx)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		_, err := Lead(ctx, pool, key, interval, lead)
		if ctx.Err() == nil {
			report(err)
		}
	}
}

// Lead tries, without waiting, to take advisory lock key on a connection of its own from pool.
// When another session holds it, Lead returns false at once. Otherwise it runs fn while it holds
// the lock, checking the lock's connection every check: fn's context ends when ctx does, when
// that check fails, or as soon as the session ends (see watch). Once fn returns, Lead releases
// the lock and returns true with fn's error, or the failed check's.
//
// The connection stays out of the pool while this process leads. fn must not use it (it does
// not see it); it uses the pool like any other code.
func Lead(ctx context.Context, pool *pgxpool.Pool, key int64, check time.Duration, fn func(context.Context) error) (bool, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	// The try and the setting below get an answer within a check (at least minTryTimeout, for a
	// short interval on a loaded server): a connection whose server stopped answering (hung, a
	// partition after the handshake) fails the try (pgx closes the connection, and the session
	// with it) instead of holding Run's loop, and every other process's chance to lead after it,
	// for ever.
	tctx, tcancel := context.WithTimeout(ctx, max(check, minTryTimeout))
	defer tcancel()
	var leader bool
	if err := conn.QueryRow(tctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&leader); err != nil {
		return false, fmt.Errorf("take leader lock: %w", err)
	}
	if !leader {
		return false, nil
	}
	defer unlock(ctx, conn, key)
	// A leader that falls silent (its host lost, a partition, a paused VM) must not keep the lock
	// until TCP's keepalive gives up (2 hours by default): Postgres ends a session idle longer
	// than three checks, and with it the lock. A live leader's checks keep it busy. Best effort:
	// a server before PostgreSQL 14 has no such setting, and leads as before (a setting without
	// an answer closes the connection: the first check sees the lock lost).
	idle := fmt.Sprintf("%dms", (3*check + time.Second).Milliseconds())
	_, _ = conn.Exec(tctx, "SELECT set_config('idle_session_timeout', $1, false)", idle)
	tcancel()

	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		if err := watch(fctx, conn.Conn().PgConn(), check); err != nil {
			cancel(&lostError{err})
		}
	}()
	err = fn(fctx)
	cancel(nil)
	<-checked // the connection is the checker's until it has stopped
	var lost *lostError
	if errors.As(context.Cause(fctx), &lost) {
		return true, errors.Join(err, lost)
	}
	return true, err
}

// minTryTimeout is the least time Lead gives the lock's try for an answer.
const minTryTimeout = 5 * time.Second

// watch checks the lock's session every check until ctx ends, and returns why the session is
// lost (nil: ctx ended first). A check that does not answer within its interval is a lost lock
// too. Between two checks it waits on the session's socket, so that a session Postgres ends (a
// terminated backend, a restart, a failover, its idle timeout) is seen as it ends: another
// process may take the lock on its next try, and must not find this one still leading until the
// next check, up to an interval later.
func watch(ctx context.Context, conn *pgconn.PgConn, check time.Duration) error {
	next := time.Now().Add(check)
	for {
		// Nothing is listened for: the wait ends at its deadline, or with the session. A
		// deadline leaves the connection usable (pgconn closes it on other errors only).
		wctx, cancel := context.WithDeadline(ctx, next)
		err := conn.WaitForNotification(wctx)
		expired := wctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !expired:
			return err
		case !expired:
			continue // a notification, for some other code's LISTEN: wait on
		}
		pctx, pcancel := context.WithTimeout(ctx, check)
		err = conn.Ping(pctx)
		pcancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		next = time.Now().Add(check)
	}
}

// lostError is a failed check of the lock's connection: the lock may be gone with it.
type lostError struct{ err error }

func (e *lostError) Error() string { return "leader lock connection: " + e.err.Error() }
func (e *lostError) Unwrap() error { return e.err }

// unlock releases key and restores the session's idle bound (the connection goes back to the
// pool), or closes the session (which releases the lock) when that fails.
func unlock(ctx context.Context, conn *pgxpool.Conn, key int64) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if _, err := conn.Exec(uctx, "SELECT pg_advisory_unlock($1)", key); err != nil {
		conn.Conn().Close(uctx) //nolint:errcheck // closing the session releases the lock
		return
	}
	// Back to the pool with the session's own idle bound (the role's, the database's or the
	// connection string's; best effort, as the leader's was set), not with none.
	_, _ = conn.Exec(uctx, "RESET idle_session_timeout")
}
