package jobs

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SetCancelPage makes s's CancelTenant and CancelDeadOfTenant cancel pages of n jobs a
// statement (cancelPageSize otherwise): a test of many pages needs few jobs.
func SetCancelPage(s *Store, n int) { s.cancelPage = n }

// WaitForLockWaiterOf is waitForLockWaiterOf, for the external tests' waitForLockWaiter.
func WaitForLockWaiterOf(ctx context.Context, pool *pgxpool.Pool, substr string) error {
	return waitForLockWaiterOf(ctx, pool, substr)
}

// SetCatchUpPage makes l's catch-up read pages of n jobs a statement (catchUpPage otherwise):
// a test of many pages needs few jobs. Call it before Run.
func SetCatchUpPage(l *Listener, n int) { l.page = n }
