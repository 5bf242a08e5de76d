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
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
			t.Fatalf("%s: count the statements waiting for a lock: %v", what, err)
		}
	}
	return answered
}
