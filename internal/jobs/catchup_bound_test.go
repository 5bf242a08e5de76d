package jobs_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/logtest"
)

// skippedLine is the Listener's warning for a catch-up that skipped locked rows.
const skippedLine = "followed jobs' rows locked past the bound; their subscribers re-read"

// TestListener_CatchUpIsBoundedOnceForAllPages: a reconnect follows many pages of jobs (pages of
// one job here), each page meeting a row lock that a long transaction holds. Each page waited
// CatchUpLockTimeout before it ran again with SKIP LOCKED: no notification flowed for pages ×
// the bound (16 × 500 ms here). Once a page met the bound, every later page skips locked rows at
// once: the catch-up waits for the bound once, warns once for all the pages it read so, and
// the free job keeps its latest event and its renewed watch.
func TestListener_CatchUpIsBoundedOnceForAllPages(t *testing.T) {
	t.Parallel()
	const bound, locked = 500 * time.Millisecond, 16
	logs := &logtest.Buffer{}
	b := setupListenerWith(t, jobs.ListenerConfig{CatchUpLockTimeout: bound,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	holder, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	var lockedChs []<-chan int
	for range locked {
		job := b.Create(t, jobstest.Opts{})
		_, err := holder.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
		require.NoError(t, err)
		ch, _ := b.connected(t, job.ID)
		lockedChs = append(lockedChs, ch)
	}
	free := b.Create(t, jobstest.Opts{})
	freeCh, _ := b.connected(t, free.ID)
	other, _ := b.connected(t, "job-a")

	b.terminate(ctx, t)

	// One bound and the reconnect's round trips, far below the pages' bounds added up (8 s).
	within := func(ch <-chan int, what string) int {
		t.Helper()
		return nextWithin(t, ch, 4*time.Second, what+" (the catch-up waits for the lock page after page)")
	}
	require.Equal(t, 0, within(other, "no job"))
	require.Equal(t, 1, within(freeCh, "the free job"), "the free job's latest event: queued")
	for i, ch := range lockedChs {
		require.Equal(t, 0, within(ch, "a locked job"), "locked job %d: read for yourself", i)
	}
	b.notify(t, "job-a:4")
	require.Equal(t, 4, within(other, "a notification after the catch-up"))

	require.Equal(t, 1, logs.Count(skippedLine), "one warning for the catch-up: %s", logs)
	require.Equal(t, 0, logs.Count("every subscriber re-reads"), "the catch-up failed: %s", logs)
	var watched bool
	require.NoError(t, b.Pool.QueryRow(ctx,
		`SELECT expires_at > now() FROM job_watches WHERE job_id = $1`, free.ID).Scan(&watched))
	require.True(t, watched, "the free job's watch is renewed")
}

// TestListener_CatchUpSkipLockedRetriesWhenChosenAsADeadlockVictim: the catch-up's SKIP LOCKED
// run (after a locked row held it past the bound) still waits for a watch's row that another
// transaction holds, and Postgres may abort it as a deadlock's victim (40P01). It was not run
// again: the catch-up failed, and every subscriber, the free job's too, was signalled 0 (every
// stream read at once). It is run again now, as the first run is. A helper transaction makes the
// cycle: it holds the locked job's row (the first run's timeout) and the free job's watch's row
// (the SKIP LOCKED run waits for it, holding the free job's row), then asks for the free job's
// row; its deadlock_timeout is long, so that the catch-up's backend is the victim.
func TestListener_CatchUpSkipLockedRetriesWhenChosenAsADeadlockVictim(t *testing.T) {
	t.Parallel()
	logs := &logtest.Buffer{}
	b := setupListenerWith(t, jobs.ListenerConfig{Logger: slog.New(slog.NewTextHandler(logs, nil))}, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	locked, free := b.Create(t, jobstest.Opts{}), b.Create(t, jobstest.Opts{})
	require.NoError(t, b.Store.Watch(ctx, free.ID, time.Minute))
	lockedCh, _ := b.connected(t, locked.ID)
	freeCh, _ := b.connected(t, free.ID)

	helper, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = helper.Rollback(context.Background()) }()
	_, err = helper.Exec(ctx, `SET LOCAL deadlock_timeout = '1h'`)
	require.NoError(t, err)
	_, err = helper.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, locked.ID)
	require.NoError(t, err)
	_, err = helper.Exec(ctx, `UPDATE job_watches SET expires_at = expires_at WHERE job_id = $1`, free.ID)
	require.NoError(t, err)

	b.terminate(ctx, t)
	// Past the bound, the SKIP LOCKED run holds the free job's row and waits for its watch's.
	waitForLockWaiter(ctx, t, b.Pool, "SKIP LOCKED", "the catch-up's SKIP LOCKED run")
	// The cycle: the helper waits for the free job's row until the catch-up is aborted, and ends
	// once it has it, in the same message (no round trip to the test): the catch-up's new try,
	// 50 ms later, finds the rows free, and does not skip the free job's for the helper's lock.
	_, err = helper.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM jobs WHERE id = '%s' FOR UPDATE; ROLLBACK`, free.ID))
	require.NoError(t, err, "the helper was the deadlock's victim")

	require.Equal(t, 1, next(t, freeCh), "the catch-up failed: every subscriber re-reads (%s)", logs)
	// The locked job's row is free by the new try: read, or skipped had the try come first.
	require.Contains(t, []int{0, 1}, next(t, lockedCh))
	require.Equal(t, 0, logs.Count("every subscriber re-reads"), "the catch-up failed: %s", logs)
}
