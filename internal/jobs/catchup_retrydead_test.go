package jobs_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestListener_CatchUpAndRetryDeadDoNotDeadlock: the Listener's catch-up after a reconnect
// share-locks its subscribed jobs' rows in ID order; RetryDead locks the dead jobs it retries
// FOR UPDATE in the order of (finished_at, id). Two dead jobs followed (the console's page of a
// dead job stays open, for its retry) whose deaths are in the other order than their IDs: the
// catch-up holds the first and waits for the second, which RetryDead holds while it waits for
// the first. Postgres aborted one (deadlock_detected): the catch-up, which then signalled every
// subscriber 0 (every stream reads at once), or RetryDead, whose command failed. The catch-up
// locks in RetryDead's order now, and both end.
func TestListener_CatchUpAndRetryDeadDoNotDeadlock(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := []string{b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1).ID, b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1).ID}
	slices.Sort(ids)
	// The first by ID died last.
	_, err := b.Pool.Exec(ctx, `UPDATE jobs SET finished_at = now() - CASE WHEN id = $1 THEN interval '1 minute' ELSE interval '2 minutes' END
		WHERE id = ANY($2::uuid[])`, ids[0], ids)
	require.NoError(t, err)
	var subs []<-chan int
	for _, id := range ids {
		ch, _ := b.connected(t, id)
		subs = append(subs, ch)
	}
	// A reader share-locks the first job: RetryDead locks the second, then waits for the first.
	blocker, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = blocker.Rollback(context.Background()) }()
	_, err = blocker.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR SHARE`, ids[0])
	require.NoError(t, err)
	type retried struct {
		jobs []jobs.Unfinished
		err  error
	}
	retrying := make(chan retried, 1)
	go func() {
		out, err := b.Store.RetryDead(ctx, jobs.DeadFilter{IDs: ids}, nil)
		retrying <- retried{out, err}
	}()
	waitForLockWaiter(ctx, t, b.Pool, "WITH old AS", "RetryDead")
	// The catch-up share-locks the first (beside the reader), and waits for the second.
	var killed bool
	require.NoError(t, b.Pool.QueryRow(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
	require.True(t, killed)
	waitForLockWaiter(ctx, t, b.Pool, "job_watches", "the catch-up")
	require.NoError(t, blocker.Rollback(ctx))

	var r retried
	select {
	case r = <-retrying:
	case <-ctx.Done():
		t.Fatal("RetryDead did not end")
	}
	require.NoError(t, r.err, "RetryDead failed")
	require.Len(t, r.jobs, 2)
	for i := range subs {
		require.NotZero(t, next(t, subs[i]), "the catch-up failed: every subscriber re-reads")
	}
}

// TestListener_CatchUpRetriesWhenChosenAsADeadlockVictim: a catch-up Postgres aborts as a
// deadlock's victim (40P01: a job that died between its snapshot and RetryDead's is ordered
// apart by the two, and RetryDead's batch, which retries its own side, may win) took no effect
// and is run again: its watches are renewed and every subscriber is signalled its job's latest
// event. It signalled every subscriber 0 (every stream and live page read at once, on a
// Postgres just back) and renewed no watch (after an outage longer than a watch, the first
// transition reached its streams a keep-alive late). A helper transaction makes the cycle: it
// holds the second job the catch-up locks, then asks for the first, which the catch-up holds;
// its deadlock_timeout is long, so that the catch-up's backend finds the cycle and is the victim.
func TestListener_CatchUpRetriesWhenChosenAsADeadlockVictim(t *testing.T) {
	t.Parallel()
	b := setupListener(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Unfinished: the catch-up locks them in ID order.
	ids := []string{b.Create(t, jobstest.Opts{}).ID, b.Create(t, jobstest.Opts{}).ID}
	slices.Sort(ids)
	var subs []<-chan int
	for _, id := range ids {
		ch, _ := b.connected(t, id)
		subs = append(subs, ch)
	}
	helper, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = helper.Rollback(context.Background()) }()
	_, err = helper.Exec(ctx, `SET LOCAL deadlock_timeout = '1h'`)
	require.NoError(t, err)
	_, err = helper.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, ids[1])
	require.NoError(t, err)

	var killed bool
	require.NoError(t, b.Pool.QueryRow(ctx,
		`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
	require.True(t, killed)
	// The catch-up holds ids[0] and waits for ids[1].
	waitForLockWaiter(ctx, t, b.Pool, "job_watches", "the catch-up")
	// The cycle: the helper waits for ids[0] until the catch-up is aborted.
	_, err = helper.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, ids[0])
	require.NoError(t, err, "the helper was the deadlock's victim")
	require.NoError(t, helper.Rollback(ctx))

	for i := range subs {
		require.Equal(t, 1, next(t, subs[i]), "the catch-up failed: every subscriber re-reads")
	}
	var watched int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM job_watches WHERE job_id = ANY($1::uuid[]) AND expires_at > now()`, ids).Scan(&watched))
	require.Equal(t, 2, watched, "the catch-up renewed no watch")
}

// waitForLockWaiter waits until a statement of pool's database whose text contains substr waits
// for a lock; what names that statement when ctx ends first.
func waitForLockWaiter(ctx context.Context, t *testing.T, pool *pgxpool.Pool, substr, what string) {
	t.Helper()
	if err := jobs.WaitForLockWaiterOf(ctx, pool, substr); err != nil {
		t.Fatalf("%s does not wait for a lock: %v", what, err)
	}
}
