package api

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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

// TestEvents_WatchRenewalsTakeTurns: the streams' renewals of their jobs' watches take turns as
// their reads do (a quarter of the pool at once), so that streams whose keep-alives fall together
// (opened together) leave the rest of the pool to polls and submits. 5,000 such renewals on a
// pool of 16 held every connection for 2 s: a poll's statement waited up to 2 s for one.
func TestEvents_WatchRenewalsTakeTurns(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	release := sync.OnceFunc(func() { close(gate) })
	var holding atomic.Bool // not while the jobs are made
	var held atomic.Int32
	queries := &queryCounter{hold: func(sql string) {
		if holding.Load() && strings.Contains(sql, "FOR SHARE") { // a renewal (watchLatestSQL)
			held.Add(1)
			<-gate
		}
	}}
	// A pool of 4: one turn. The poll may wait long for a connection (one to dial, on a loaded
	// machine), not for one the renewals hold: they hold them until it is answered.
	b := setup(t, setupOpts{dbURL: pgtest.URL(t) + "&pool_max_conns=4", noListener: true,
		storeWait: 20 * time.Second, storeTimeout: time.Minute, queries: queries})
	t.Cleanup(release) // before the pool closes, which waits for the connections held
	ids := make([]string, 4)
	for i := range ids {
		ids[i] = b.create(t, "").ID
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := (&http.Request{}).WithContext(ctx)
	holding.Store(true)
	followers := make([]*follower, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		defer b.srv.reads.follow(id)()
		followers[i] = &follower{known: 1}
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.srv.keepAliveReads(r, id, followers[i])
		}()
	}
	// Every renewal asked, the first one holds its connection.
	waitFor(t, func() bool {
		b.srv.reads.mu.Lock()
		defer b.srv.reads.mu.Unlock()
		for _, id := range ids {
			if e := b.srv.reads.jobs[id]; e == nil || e.renewing == nil {
				return false
			}
		}
		return held.Load() >= 1
	})

	poll := b.do(t, http.MethodGet, "/v1/jobs/"+ids[0], "", nil)
	require.Equal(t, http.StatusOK, poll.status, "a poll while the streams renew: %v", poll.body)
	require.EqualValues(t, 1, held.Load(), "renewals running at once")
	release()
	wg.Wait()
	for i, f := range followers {
		require.NotNil(t, f.renewal, "renewal %d failed", i)
	}
}
