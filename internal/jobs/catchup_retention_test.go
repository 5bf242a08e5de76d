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

// TestListener_CatchUpAndRetentionDoNotDeadlock: the Listener's catch-up after a reconnect
// share-locks its subscribed jobs' rows in one statement (in ID order), and the retention pass
// (Store.DeleteFinished) locks the finished jobs it deletes in the order of finished_at, then
// deletes their watches by cascade. Were either to wait on the other's rows while holding ones
// the other waits on, Postgres would abort one (40P01), and an aborted catch-up signals every
// subscriber 0, every stream reading at once. Neither does: retention locks FOR UPDATE SKIP
// LOCKED (it passes over a row the catch-up holds), and the catch-up holds the watch of no job
// it has not share-locked. Both orders of their locks are run here, each held at the point where
// a cycle would form, and both statements end, the catch-up's signals the jobs' latest events.
func TestListener_CatchUpAndRetentionDoNotDeadlock(t *testing.T) {
	t.Parallel()

	// Three jobs in ID order (the catch-up's), canceled but for those in keep.
	jobsInIDOrder := func(t *testing.T, b *listenerBundle, keep int) []string {
		t.Helper()
		var ids []string
		for range 3 {
			ids = append(ids, b.Create(t, jobstest.Opts{}).ID)
		}
		slices.Sort(ids) // Postgres orders UUIDs as their lowercase text does
		for _, id := range ids[keep:] {
			_, err := b.Store.Cancel(context.Background(), id)
			require.NoError(t, err)
		}
		return ids
	}
	reconnect := func(t *testing.T, b *listenerBundle) {
		t.Helper()
		var killed bool
		require.NoError(t, b.Pool.QueryRow(context.Background(),
			`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, b.appName).Scan(&killed))
		require.True(t, killed)
	}
	type deleted struct {
		n   int64
		err error
	}
	retention := func(ctx context.Context, b *listenerBundle) <-chan deleted {
		out := make(chan deleted, 1)
		go func() {
			n, err := b.Store.DeleteFinished(ctx, jobs.StatusCanceled, time.Now().Add(time.Hour), 1000)
			out <- deleted{n, err}
		}()
		return out
	}
	answer := func(t *testing.T, ch <-chan deleted) deleted {
		t.Helper()
		select {
		case d := <-ch:
			return d
		case <-time.After(30 * time.Second):
			t.Fatal("the retention pass did not end within 30 s")
		}
		return deleted{}
	}

	t.Run("CatchUpFirst", func(t *testing.T) {
		t.Parallel()
		b := setupListener(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ids := jobsInIDOrder(t, b, 0)
		var subs []<-chan int
		for _, id := range ids {
			ch, _ := b.connected(t, id)
			subs = append(subs, ch)
		}
		// The catch-up share-locks the first job and waits for the second.
		blocker, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = blocker.Rollback(context.Background()) }()
		_, err = blocker.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, ids[1])
		require.NoError(t, err)
		reconnect(t, b)
		waitForLockWaiter(ctx, t, b.Pool, "job_watches", "the catch-up")

		// Retention passes over the two it cannot lock, without waiting, and deletes the third.
		d := answer(t, retention(ctx, b))
		require.NoError(t, d.err)
		require.Equal(t, int64(1), d.n)
		require.NoError(t, blocker.Rollback(ctx))

		require.Equal(t, 2, next(t, subs[0]), "queued, canceled: the catch-up was not aborted")
		require.Equal(t, 2, next(t, subs[1]))
		require.Equal(t, 0, next(t, subs[2]), "deleted")
	})

	t.Run("RetentionFirst", func(t *testing.T) {
		t.Parallel()
		b := setupListener(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ids := jobsInIDOrder(t, b, 1) // the first, not finished, is no victim of retention
		var subs []<-chan int
		for _, id := range ids {
			ch, _ := b.connected(t, id)
			subs = append(subs, ch)
		}
		// Retention locks (and deletes) the two finished jobs, then waits for the last one's
		// watch, which its delete cascades to.
		require.NoError(t, b.Store.Watch(ctx, ids[2], time.Minute))
		blocker, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = blocker.Rollback(context.Background()) }()
		_, err = blocker.Exec(ctx, `SELECT 1 FROM job_watches WHERE job_id = $1 FOR UPDATE`, ids[2])
		require.NoError(t, err)
		deleting := retention(ctx, b)
		waitForLockWaiter(ctx, t, b.Pool, "victims", "the retention pass")
		// The catch-up share-locks the first job, renews its watch, and waits for the second.
		reconnect(t, b)
		waitForLockWaiter(ctx, t, b.Pool, "job_watches (job_id", "the catch-up")
		require.NoError(t, blocker.Rollback(ctx))

		d := answer(t, deleting)
		require.NoError(t, d.err)
		require.Equal(t, int64(2), d.n)
		require.Equal(t, 1, next(t, subs[0]), "queued: the catch-up was not aborted")
		require.Equal(t, 0, next(t, subs[1]), "deleted")
		require.Equal(t, 0, next(t, subs[2]), "deleted")
	})
}
