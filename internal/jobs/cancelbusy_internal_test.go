package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestStore_CancelOfAJobEndingUnderEachRunIsBusy: a dead job that an operator's retry puts back
// and that ends again while each of the cancel's runs waits for its row's lock (injected before
// each run: another session locks the dead row, and once the run waits, ends the job and
// commits; the next run finds it dead again) is no job the cancel can end: after cancelTries
// runs it answers ErrBusy, having changed nothing, which the API answers 503 job_busy with
// Retry-After. It answered an unnamed error, which the API answered 500 internal.
func TestStore_CancelOfAJobEndingUnderEachRunIsBusy(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	s := NewStore(pool, nil)
	job, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)

	var runs int
	var ended chan error // the last run's ender: nil before the first run
	s.beforeCancelRun = func(ctx context.Context, run int) {
		runs = run
		if ended != nil {
			require.NoError(t, <-ended)
		}
		// Retried and dead again (as RetryDead then a dying attempt leave it).
		_, err := direct.Exec(ctx, `UPDATE jobs SET status = 'dead', dead_reason = 'retries_exhausted',
			finished_at = now() WHERE id = $1`, job.ID)
		require.NoError(t, err)
		tx, err := direct.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
		require.NoError(t, err)
		ended = make(chan error, 1)
		go func() {
			defer func() { _ = tx.Rollback(context.Background()) }()
			if err := waitForLockWaiterOf(ctx, direct, "live AS"); err != nil {
				ended <- err
				return
			}
			// Retried, run and ended (failed) while the cancel's run waited.
			if _, err := tx.Exec(ctx, `UPDATE jobs SET status = 'failed', dead_reason = NULL WHERE id = $1`, job.ID); err != nil {
				ended <- err
				return
			}
			ended <- tx.Commit(ctx)
		}()
	}
	_, err = s.Cancel(ctx, job.ID)
	require.ErrorIs(t, err, ErrBusy)
	require.NoError(t, <-ended)
	require.Equal(t, cancelTries, runs)
	got, err := s.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, StatusFailed, got.Status, "the cancel changed nothing")
	var canceledEvents int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = $1 AND type = 'canceled'`,
		job.ID).Scan(&canceledEvents))
	require.Zero(t, canceledEvents)
}

// waitForLockWaiterOf waits until a statement of the database whose text holds substr waits
// for a lock, polling until ctx ends (its error then).
func waitForLockWaiterOf(ctx context.Context, pool *pgxpool.Pool, substr string) error {
	for {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND strpos(query, $1) > 0`, substr).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}
