package migrations

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Default schedule of a LockWatch's reports.
const (
	DefaultLockReportFirst = time.Second
	DefaultLockReportEvery = 15 * time.Second
)

// lockHolderTimeout bounds each look-up of the lock's holder: a report is not worth a hang.
const lockHolderTimeout = 5 * time.Second

// LockWatch says how Up reports a wait for the migration lock that another session holds (a
// process migrating, or `ctl migrate`, elsewhere): without it the wait is silent, and an operator
// cannot tell it from a hang. The wait itself is not bounded by the watch: only by Up's context
// (and the session's lock_timeout, if the role or database sets one).
type LockWatch struct {
	// Report, when not nil, is told of the wait once it has lasted First, and again every Every
	// while it lasts; never after Up has taken the lock or returned. A wait shorter than First
	// (processes starting together, the schema up to date) is not reported.
	Report func(LockWait)
	// First and Every default to DefaultLockReportFirst and DefaultLockReportEvery when zero.
	First, Every time.Duration
}

// LockWait is one report of a wait for the migration lock.
type LockWait struct {
	// Waited is how long Up has waited so far.
	Waited time.Duration
	// Holder is the session holding the lock, as Postgres shows it (pg_locks, pg_stat_activity);
	// nil when it could not be told (the lock was just let go, or the look-up failed: Err).
	Holder *LockHolder
	// Err is why the holder could not be looked up, if it could not.
	Err error
}

// LockHolder is the session holding the migration lock. Postgres shows another role's session's
// client address, state and start of its query only to a superuser or a member of
// pg_read_all_stats: without that privilege they are empty.
type LockHolder struct {
	PID         int
	User        string
	Application string
	Client      string
	// State is the session's state (active: it is migrating; idle in transaction: it holds the
	// lock and waits for its client).
	State string
	// Since is when it connected (backend_start); StateSince, when it entered State.
	Since, StateSince time.Time
}

// String describes the holder on one line, for a log or an operator.
func (h LockHolder) String() string {
	parts := []string{fmt.Sprintf("pid %d", h.PID)}
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+" "+v)
		}
	}
	add("user", h.User)
	add("application", fmt.Sprintf("%q", h.Application))
	add("client", h.Client)
	if h.State != "" {
		st := h.State
		if !h.StateSince.IsZero() {
			st += " for " + time.Since(h.StateSince).Round(time.Second).String()
		}
		add("state", st)
	}
	if !h.Since.IsZero() {
		add("connected", h.Since.UTC().Format(time.RFC3339))
	}
	return strings.Join(parts, ", ")
}

// String describes the wait on one line.
func (w LockWait) String() string {
	s := fmt.Sprintf("waiting %s for the migration lock", w.Waited.Round(time.Second))
	switch {
	case w.Holder != nil:
		return s + ", held by " + w.Holder.String()
	case w.Err != nil:
		return s + " (its holder could not be looked up: " + w.Err.Error() + ")"
	default:
		return s + " (its holder was not found: it may just have let it go)"
	}
}

// watchLock reports, as w says, the wait for the migration lock that starts now, until the
// returned stop is called; stop returns once no report is under way.
func watchLock(ctx context.Context, pool *pgxpool.Pool, w LockWatch) (stop func()) {
	if w.Report == nil {
		return func() {}
	}
	first, every := w.First, w.Every
	if first <= 0 {
		first = DefaultLockReportFirst
	}
	if every <= 0 {
		every = DefaultLockReportEvery
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		t := time.NewTimer(first)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			holder, err := lockHolder(ctx, pool)
			if ctx.Err() != nil {
				return // the lock was taken (or Up gave up) during the look-up
			}
			w.Report(LockWait{Waited: time.Since(start), Holder: holder, Err: err})
			t.Reset(every)
		}
	}()
	return func() {
		cancel()
		wg.Wait()
	}
}

// lockHolder looks up the session holding the migration lock in the pool's database: nil when
// none does.
func lockHolder(ctx context.Context, pool *pgxpool.Pool) (*LockHolder, error) {
	ctx, cancel := context.WithTimeout(ctx, lockHolderTimeout)
	defer cancel()
	// An advisory lock on one bigint key is shown with its high half as classid, its low half
	// as objid, and objsubid 1.
	rows, err := pool.Query(ctx, `SELECT coalesce(l.pid, 0), coalesce(a.usename, ''), coalesce(a.application_name, ''),
		coalesce(host(a.client_addr), ''), coalesce(a.state, ''), a.backend_start, a.state_change
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid
		LIMIT 1`, advisoryLockKey)
	if err != nil {
		return nil, fmt.Errorf("read pg_locks: %w", err)
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read pg_locks: %w", err)
		}
		return nil, nil
	}
	var h LockHolder
	var since, stateSince *time.Time
	if err := rows.Scan(&h.PID, &h.User, &h.Application, &h.Client, &h.State, &since, &stateSince); err != nil {
		return nil, fmt.Errorf("read pg_locks: %w", err)
	}
	if since != nil {
		h.Since = *since
	}
	if stateSince != nil {
		h.StateSince = *stateSince
	}
	return &h, nil
}
