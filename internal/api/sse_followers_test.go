package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestEvents_FollowersOfOneJobShareTheirReads: the streams of one job on a replica read the
// job's events and the job once per transition between them all, not once each. Each stream
// read both after every notification before: 1,000 followers of one job cost Postgres 2,000
// statements per transition.
func TestEvents_FollowersOfOneJobShareTheirReads(t *testing.T) {
	t.Parallel()
	const followers = 30
	b, job, first, _, queries := tickedStream(t, setupOpts{}) // no keep-alive tick is sent
	streams := []*stream{first}
	for range followers - 1 {
		s := openStream(t, b.url, job.ID, "")
		require.Equal(t, "queued", s.nextEvent(t).event)
		streams = append(streams, s)
	}

	before := queries.n.Load()
	running, err := b.store.BeginAttempt(context.Background(), job.ID)
	require.NoError(t, err)
	for _, s := range streams {
		require.Equal(t, "running/2", names([]sseFrame{s.nextEvent(t)})[0])
	}
	require.Equal(t, int64(2), queries.n.Load()-before, "one read of the events and one of the job, for every stream")

	// And again: the read kept from the last transition does not stand in for this one's.
	before = queries.n.Load()
	applied, err := b.store.Finish(context.Background(), job.ID, &jobs.Attempt{
		Number: running.Attempts, Credential: "default", StartedAt: time.Now(), Latency: time.Millisecond, Class: "ok",
	}, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{"answer":42}`)})
	require.NoError(t, err)
	require.True(t, applied)
	for _, s := range streams {
		require.Equal(t, []string{"succeeded/3"}, names(s.rest(t)))
	}
	require.Equal(t, int64(3), queries.n.Load()-before, "the finish's own statement (it selects FROM jobs), and one read for every stream")
}

// TestEvents_FailedWatchRenewalsLogThrottled: while Postgres is unreachable, the watch renewals
// of a replica's streams that fail log one line per streamLogInterval between them all, the next
// one counting those left out. Each logged a line before: 10,000 streams in an outage wrote 670
// lines a second.
func TestEvents_FailedWatchRenewalsLogThrottled(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	clock := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	proxy, proxied := pgtest.NewProxy(t, pgtest.URL(t))
	b, _, s, ticks, _ := tickedStream(t, setupOpts{dbURL: proxied, now: clock.Now,
		logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	// The reports of the lines held back (TestStreamWarn_LastSuppressedAreLogged) never fire
	// here: a real timer would fire by the wall clock, not the test's.
	b.srv.streamLog.SetAfterFunc(func(time.Duration, func()) func() bool {
		return func() bool { return true }
	})

	proxy.Cut()
	for range 10 {
		keepAlive(t, ticks, s)
	}
	require.Equal(t, 1, logs.Count(`"msg":"renew event watch"`), "one line for ten failed renewals: %s", logs.String())
	clock.Advance(streamLogInterval)
	keepAlive(t, ticks, s)
	keepAlive(t, ticks, s) // the line of the one before is written by now
	require.Equal(t, 2, logs.Count(`"msg":"renew event watch"`), logs.String())
	require.Equal(t, 1, logs.Count(`"suppressed":9`), "the next line counts those left out: %s", logs.String())
}
