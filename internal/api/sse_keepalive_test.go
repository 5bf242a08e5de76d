package api

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestEvents_IdleKeepAliveCostsOneStatement: an idle stream's keep-alive renews its watch of the
// job, one statement, which also tells whether the job has an event the stream has not read; it
// reads the events and the job only then. Every keep-alive read them both before: three
// statements per idle stream every 15s, 2,000 a second for 10,000 idle streams of one replica.
func TestEvents_IdleKeepAliveCostsOneStatement(t *testing.T) {
	t.Parallel()

	t.Run("Idle", func(t *testing.T) {
		t.Parallel()
		_, _, s, ticks, queries := tickedStream(t, setupOpts{})
		before := queries.n.Load()
		for range 3 {
			keepAlive(t, ticks, s)
		}
		require.Equal(t, int64(3), queries.n.Load()-before, "one statement (the watch) per keep-alive")
	})

	t.Run("ReadsWhatNoNotificationAnnounced", func(t *testing.T) {
		t.Parallel()
		// No Listener: every transition is one whose notification is lost.
		b, job, s, ticks, queries := tickedStream(t, setupOpts{noListener: true})

		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
		before := queries.n.Load()
		keepAlive(t, ticks, s)
		require.Equal(t, []string{"running/2", "retrying/3"}, names([]sseFrame{s.nextEvent(t), s.nextEvent(t)}))
		require.Equal(t, int64(3), queries.n.Load()-before, "the watch, then the events and the job")

		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
		tick(t, ticks)
		require.Equal(t, []string{"running/4", "succeeded/5"}, names(s.rest(t)))
	})
}

// TestEvents_FirstKeepAliveAtItsDraw: a stream's first keep-alive comes at its draw in
// [KeepAlive/2, KeepAlive) after it opened (firstKeepAlive), the later ones every KeepAlive.
// Every stream's ticker ticked every KeepAlive from its open: the streams a reconnect storm
// opened together renewed their watches together, in one burst per keep-alive, for good.
func TestEvents_FirstKeepAliveAtItsDraw(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		draw  float64
		first time.Duration
	}{{0, 4 * time.Second}, {0.25, 5 * time.Second}, {0.999, 7996 * time.Millisecond}} {
		require.Equal(t, tc.first, firstKeepAlive(8*time.Second, tc.draw), "draw %v", tc.draw)
	}

	tk := &fakeTicker{c: make(chan time.Time)}
	b := setup(t, setupOpts{keepAlive: 8 * time.Second, keepAliveRand: func() float64 { return 0.25 },
		newTicker: func(d time.Duration) (<-chan time.Time, ticker) { tk.record("new", d); return tk.c, tk }})
	job := b.create(t, "")
	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, "queued", s.nextEvent(t).event)
	require.Equal(t, []string{"new 5s"}, tk.calls(), "the first keep-alive at the draw's 5s")

	for range 2 {
		keepAlive(t, tk.c, s)
	}
	require.Equal(t, []string{"new 5s", "reset 8s"}, tk.calls(), "every KeepAlive from the first on")
	s.close()
	require.Eventually(t, func() bool { return len(tk.calls()) == 3 }, 30*time.Second, time.Millisecond)
	require.Equal(t, "stop 0s", tk.calls()[2], "the stream's end stops its ticker")
}

// fakeTicker is a stream's keep-alive ticker (setupOpts.newTicker) whose ticks the test sends on
// c, recording the calls made to it.
type fakeTicker struct {
	c   chan time.Time
	mu  sync.Mutex
	log []string
}

func (f *fakeTicker) record(call string, d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, call+" "+d.String())
}

func (f *fakeTicker) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

func (f *fakeTicker) Reset(d time.Duration) { f.record("reset", d) }
func (f *fakeTicker) Stop()                 { f.record("stop", 0) }
