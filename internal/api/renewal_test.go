package api

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestEvents_FollowersShareWatchRenewals: the keep-alives of a job's streams share one renewal of
// its watch made within half a keep-alive, where each renewed it (a share lock on the job's row
// each: 1,000 idle followers of one job were 67 statements a second). A stream never takes its
// own last renewal again (its watch would lapse), and one older than half a keep-alive is made
// anew. What a shared renewal finds still makes a stream read what it has not.
func TestEvents_FollowersShareWatchRenewals(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	queries := &queryCounter{}
	b := setup(t, setupOpts{noListener: true, now: clock.Now, queries: queries})
	job := b.create(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := (&http.Request{}).WithContext(ctx)
	defer b.srv.reads.follow(job.ID)()
	defer b.srv.reads.follow(job.ID)()
	one, two := &follower{known: 1}, &follower{known: 1}
	renewals := func(f *follower) int64 {
		t.Helper()
		before := queries.n.Load()
		reads, need := b.srv.keepAliveReads(r, job.ID, f)
		require.Equal(t, readBuffer, reads, "nothing to read")
		require.Zero(t, need)
		return queries.n.Load() - before
	}

	require.Equal(t, int64(1), renewals(one))
	require.Equal(t, int64(0), renewals(two), "the other stream's renewal, just made")
	require.Equal(t, int64(1), renewals(one), "never a stream's own last renewal")
	clock.Advance(b.srv.cfg.KeepAlive / 2)
	require.Equal(t, int64(1), renewals(two), "a renewal half a keep-alive old is made anew")
	require.Equal(t, int64(0), renewals(one))

	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	for i, f := range []*follower{two, one} { // its own last renewal, then the one it made
		before := queries.n.Load()
		reads, need := b.srv.keepAliveReads(r, job.ID, f)
		require.Equal(t, readStatus, reads, "the renewal found events the stream has not read")
		require.Equal(t, 3, need)
		require.Equal(t, int64(1-i), queries.n.Load()-before)
	}
}

// TestEvents_WatchRenewalWaitsAtMostStoreWait: a keep-alive's renewal of the watch waits at most
// StoreWait for a connection of a busy pool, then the stream goes on (the failure logged) and
// renews at its next keep-alive. It waited as long as the client stayed: the stream sent nothing,
// not even the events its notifications announced, until a connection came free.
func TestEvents_WatchRenewalWaitsAtMostStoreWait(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{dbURL: pgtest.URL(t) + "&pool_max_conns=1", noListener: true, storeWait: 50 * time.Millisecond,
		storeTimeout: time.Minute}) // the wait, not the whole renewal's bound, ends it
	job := b.create(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := (&http.Request{}).WithContext(ctx)
	defer b.srv.reads.follow(job.ID)()

	held, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	release := sync.OnceFunc(held.Release)
	defer release()
	type answer struct {
		reads streamReads
		need  int
	}
	done := make(chan answer, 1)
	go func() {
		reads, need := b.srv.keepAliveReads(r, job.ID, &follower{known: 1})
		done <- answer{reads, need}
	}()
	select {
	case a := <-done:
		require.Equal(t, answer{readBuffer, 0}, a, "a failed renewal: the stream goes on")
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("the renewal still waits for a pool connection after 30s (StoreWait 50ms)")
	}
	release()
	reads, need := b.srv.keepAliveReads(r, job.ID, &follower{})
	require.Equal(t, answer{readStatus, 1}, answer{reads, need}, "renewed once a connection is free")
}
