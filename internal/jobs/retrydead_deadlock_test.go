package jobs_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_RetryDeadRetriesABatchChosenAsADeadlockVictim: a batch of RetryDead that Postgres
// aborts as a deadlock's victim (40P01; the Listener's catch-up can still make one against it when
// a job dies between the two statements' snapshots) took no effect, and is run again: the run
// completes. It failed the run (`ctl dead retry`, the console's retry-all) with "deadlock
// detected". A helper transaction makes the cycle: it holds the second job RetryDead locks, then
// asks for the first, which RetryDead holds; its deadlock_timeout is long, so that RetryDead's
// backend finds the cycle and is the victim.
func TestStore_RetryDeadRetriesABatchChosenAsADeadlockVictim(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := []string{b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1).ID, b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1).ID}
	slices.Sort(ids)
	// ids[0] died first: RetryDead locks it, then ids[1].
	_, err := b.Pool.Exec(ctx, `UPDATE jobs SET finished_at = now() - CASE WHEN id = $1 THEN interval '2 minutes' ELSE interval '1 minute' END
		WHERE id = ANY($2::uuid[])`, ids[0], ids)
	require.NoError(t, err)

	helper, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = helper.Rollback(context.Background()) }()
	_, err = helper.Exec(ctx, `SET LOCAL deadlock_timeout = '1h'`)
	require.NoError(t, err)
	_, err = helper.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR SHARE`, ids[1])
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
	// RetryDead holds ids[0] and waits for ids[1].
	waitForLockWaiter(ctx, t, b.Pool, "WITH old AS", "RetryDead")
	// The cycle: the helper waits for ids[0] until RetryDead's batch is aborted.
	_, err = helper.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR SHARE`, ids[0])
	require.NoError(t, err, "the helper was the deadlock's victim")
	require.NoError(t, helper.Rollback(ctx))

	var r retried
	select {
	case r = <-retrying:
	case <-ctx.Done():
		t.Fatal("RetryDead did not end")
	}
	require.NoError(t, r.err, "RetryDead failed")
	require.Len(t, r.jobs, 2)
	for _, id := range ids {
		j, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, j.Status)
	}
}
