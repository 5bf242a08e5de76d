package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// LockWaitingOrAnswered waits, until ctx ends (then fails the test naming what), for each of n
// requests to be either answered on answers or waiting for a lock in Postgres (counted on watch,
// a connection of its own to the test's database), and returns the answers it took.
func LockWaitingOrAnswered[T any](ctx context.Context, t testing.TB, watch *pgx.Conn, answers <-chan T, n int, what string) []T {
	t.Helper()
	var answered []T
	for waiting := 0; waiting+len(answered) < n; {
		select {
		case a := <-answers:
			answered = append(answered, a)
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("%s: %d waiting in Postgres, answered %v", what, waiting, answered)
		}
		var err error
		if waiting, err = lockWaiters(ctx, watch); err != nil {
			t.Fatalf("%s: count the statements waiting for a lock: %v", what, err)
		}
	}
	return answered
}

// Querier is what LockWaitersGone reads pg_stat_activity through: a *pgx.Conn or a
// *pgxpool.Pool.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// LockWaitersGone waits, for at most 15 s (then fails the test naming what), until no statement
// of the test's database waits for a lock. A statement whose request was answered at its
// deadline is not gone at once: pgx cancels it as the answer goes, on a connection of its own;
// a test that lets go of the lock before that lets the abandoned statement run.
func LockWaitersGone(t testing.TB, q Querier, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		waiting, err := lockWaiters(ctx, q)
		if err != nil {
			t.Fatalf("%s: count the statements waiting for a lock: %v", what, err)
		}
		if waiting == 0 {
			return
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			t.Fatalf("%s: %d statements still wait for a lock", what, waiting)
		}
	}
}

// lockWaiters counts the statements of the test's database waiting for a lock.
func lockWaiters(ctx context.Context, q Querier) (n int, err error) {
	err = q.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
	return n, err
}
