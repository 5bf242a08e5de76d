package api

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestEvents_StreamsOfJobsEndingTogetherWaitTheirTurn: when many followed jobs end at the same
// moment, their streams' reads (one per job) take turns on the pool instead of all waiting for a
// connection at once, each against its own bound: every stream gets its terminal event. Before,
// 500 streams on jobs that ended together with 800 kB answers (a pool of 16) ended 141 of them
// with "read job events: the job store did not answer in time", the reads past the first
// sixteen having spent their bounds in the pool's queue.
func TestEvents_StreamsOfJobsEndingTogetherWaitTheirTurn(t *testing.T) {
	t.Parallel()
	const streams = 6
	dbURL := pgtest.URL(t)
	// The first reads of the events are held (their connections with them) until the reads
	// queued behind them have waited longer than StoreWait for a connection, or a while.
	gate := make(chan struct{})
	var holding atomic.Bool // not while the streams open
	var gated sync.Once
	release := func() { gated.Do(func() { close(gate) }) }
	t.Cleanup(release)
	queries := &queryCounter{hold: func(sql string) {
		if holding.Load() && strings.Contains(sql, "FROM job_events WHERE job_id = $1 AND seq > $2") {
			<-gate
		}
	}}
	b := setup(t, setupOpts{dbURL: dbURL + "&pool_max_conns=2", storeWait: 100 * time.Millisecond,
		storeTimeout: time.Minute, queries: queries})
	// The worker's transitions on a pool of their own: the API's is the one under test.
	wpool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(wpool.Close)
	worker := jobs.NewStore(wpool, nil)

	ids := make([]string, streams)
	open := make([]*stream, streams)
	for i := range streams {
		ids[i] = b.create(t, "").ID
		open[i] = openStream(t, b.url, ids[i], "")
		require.Equal(t, "queued", open[i].nextEvent(t).event)
	}
	holding.Store(true)
	for _, id := range ids {
		job, err := worker.BeginAttempt(context.Background(), id)
		require.NoError(t, err)
		applied, err := worker.Finish(context.Background(), id, &jobs.Attempt{Number: job.Attempts,
			Credential: "default", StartedAt: time.Now(), Latency: time.Millisecond, Class: "ok"},
			jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"answer":42}`)})
		require.NoError(t, err)
		require.True(t, applied)
	}
	// Held until a wait for a connection ran out (the failure), or for 10 bounds of StoreWait.
	deadline := time.Now().Add(time.Second)
	for b.pool.Stat().CanceledAcquireCount() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	release()

	for i, s := range open {
		got := names(s.rest(t))
		require.NotEmpty(t, got, "stream %d ended without an event", i)
		require.Equal(t, "succeeded", strings.Split(got[len(got)-1], "/")[0], "stream %d: %v", i, got)
	}
	require.Zero(t, b.pool.Stat().CanceledAcquireCount(), "no read waited for a connection past StoreWait")
}
