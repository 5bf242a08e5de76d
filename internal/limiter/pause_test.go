package limiter_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

func TestCredential_Pause(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := "sk-spend-cap"
	creds := []*limiter.Gate{b.lim.Gate(id, "main"), b.lim2.Gate(id, "main")}
	ctx := t.Context()

	// concurrently runs f from 50 callers over both clients and counts the trues.
	concurrently := func(f func(c *limiter.Gate, i int) (bool, error)) int {
		var n atomic.Int64
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() {
				ok, err := f(creds[i%2], i)
				if err != nil {
					t.Error(err)
				}
				if ok {
					n.Add(1)
				}
			})
		}
		wg.Wait()
		return int(n.Load())
	}

	st, err := creds[0].Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{Unknown: true}, st, "never paused nor resumed: Redis holds no state")

	var starter atomic.Value
	require.Equal(t, 1, concurrently(func(c *limiter.Gate, i int) (bool, error) {
		job := "job-" + string(rune('A'+i%26)) + string(rune('a'+i/26))
		started, err := c.Pause(ctx, "rate_limited_no_retry_after", job)
		if started {
			starter.Store(job)
		}
		return started, err
	}), "exactly one caller starts the episode")
	st, err = creds[1].Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
	require.True(t, t0.Equal(st.Since))
	require.Equal(t, "rate_limited_no_retry_after", st.Reason)
	require.Equal(t, starter.Load(), st.FirstJobID)
	require.Equal(t, 1.0, b.metric(t, "llmq_limiter_paused", "main"))

	// Automatic probes: none before one interval, then one per interval.
	every := 30 * time.Second
	probe := func(c *limiter.Gate, _ int) (bool, error) {
		p, err := c.TryProbe(ctx, every)
		return p.Granted(), err
	}
	require.Equal(t, 0, concurrently(probe))
	b.clock.Advance(every)
	require.Equal(t, 1, concurrently(probe))
	b.clock.Advance(every - time.Millisecond)
	require.Equal(t, 0, concurrently(probe))
	b.clock.Advance(time.Millisecond)
	require.Equal(t, 1, concurrently(probe))

	// A pause does not expire by itself.
	b.clock.Advance(24 * time.Hour)
	st, err = creds[0].Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)

	was, err := creds[1].Resume(ctx)
	require.NoError(t, err)
	require.True(t, was)
	st, err = creds[0].Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st, "a resume leaves Redis knowing the credential is not paused")
	require.Equal(t, 0.0, b.metric(t, "llmq_limiter_paused", "main"))
	require.Equal(t, 0, concurrently(probe), "no probes when not paused")
	was, err = creds[1].Resume(ctx)
	require.NoError(t, err)
	require.False(t, was)

	// The next spend cap is a new episode.
	started, err := creds[0].Pause(ctx, "rate_limited_no_retry_after", "job-next")
	require.NoError(t, err)
	require.True(t, started)
}

// TestCredential_PauseLostByRedis: with AttemptOptions.PauseDurable, an ask on a credential
// whose pause state Redis does not hold (lost in a restart or a flush, or never written) is
// refused as PauseUnknown, taking nothing; RestorePause writes back the state kept elsewhere,
// unless Redis holds one again by then (a pause or a resume made since), which it leaves alone.
func TestCredential_PauseLostByRedis(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c := b.lim.Gate("sk-lost", "main")
	ctx := t.Context()
	lim := limiter.Limit{Rate: 1, Burst: 1}
	durable := limiter.AttemptOptions{UnlessPaused: true, PauseDurable: true, FirstAttempt: true}
	lose := func() { redistest.Unlink(context.WithoutCancel(ctx), redistest.Client(t), b.prefix+"*") }
	reserve := func(opts limiter.AttemptOptions) limiter.Reservation {
		t.Helper()
		r, err := c.AcquireAttempt(ctx, lim, tokens.Cost{}, time.Hour, opts)
		require.NoError(t, err)
		return r
	}

	// Nothing written yet: refused as unknown, with nothing reserved; without PauseDurable the
	// check is as before.
	r := reserve(durable)
	require.True(t, r.PauseUnknown)
	require.False(t, r.Granted)
	require.False(t, r.Paused.Paused)
	require.Zero(t, r.Seq)
	restored, err := c.RestorePause(ctx, limiter.PauseState{})
	require.NoError(t, err)
	require.True(t, restored)
	r = reserve(durable)
	require.True(t, r.Granted)
	require.Zero(t, r.Wait, "the refusal took no slot")
	restored, err = c.RestorePause(ctx, limiter.PauseState{Paused: true, Since: t0, Reason: "stale"})
	require.NoError(t, err)
	require.False(t, restored, "a state Redis holds stays")

	// A pause Redis lost is refused as unknown until restored, then refused as the same episode.
	_, err = c.Pause(ctx, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	kept, err := c.Paused(ctx)
	require.NoError(t, err)
	lose()
	r = reserve(limiter.AttemptOptions{UnlessPaused: true})
	require.True(t, r.Granted, "without PauseDurable a lost pause lets the ask through")
	lose()
	r = reserve(durable)
	require.True(t, r.PauseUnknown)
	restored, err = c.RestorePause(ctx, kept)
	require.NoError(t, err)
	require.True(t, restored)
	require.Equal(t, 1.0, b.metric(t, "llmq_limiter_paused", "main"))
	r = reserve(durable)
	require.False(t, r.Granted)
	require.Equal(t, kept, r.Paused)
	started, err := c.Pause(ctx, "rate_limited_no_retry_after", "job-2")
	require.NoError(t, err)
	require.False(t, started, "the restored episode goes on")

	// A resume made before the restore lands wins over it.
	_, err = c.Resume(ctx)
	require.NoError(t, err)
	restored, err = c.RestorePause(ctx, kept)
	require.NoError(t, err)
	require.False(t, restored)
	st, err := c.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)
}

// TestCredential_PauseStateSharedWithTheLastRelease: during a rolling upgrade the workers, ctl and
// consoles of the last release (1a97d08) share the pause hash with this one. Their pause began
// an episode only when the hash did not exist (EXISTS), and their resume deleted it. A state
// this release writes for a credential that is not paused (a resume, or the restore every new
// worker's pause refresh makes at start) must not stop an old worker's spend-cap answer from
// pausing the credential (it would dead-letter every job it takes on it, without an alert), and
// an old resume must not read as a state Redis lost (a new worker would restore the pause from
// Postgres: the resume undone). On a Redis Cluster too: the pause's keys share the
// credential's slot.
func TestCredential_PauseStateSharedWithTheLastRelease(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		testPauseStateSharedWithTheLastRelease(t, redistest.ClientOf(t, target.URL), redistest.PrefixOn(t, target.URL))
	})
}

func testPauseStateSharedWithTheLastRelease(t *testing.T, rdb redis.UniversalClient, prefix string) {
	l, err := limiter.New(rdb, &limiter.Config{Prefix: prefix, Now: clocktest.New(t0).Now})
	require.NoError(t, err)
	id := "sk-rolling"
	c := l.Gate(id, "main")
	ctx := t.Context()
	key := prefix + redisscript.CredentialTag(id) + ":pause"
	// The last release's Gate.Pause (its script, the time given as µs) and Gate.Resume.
	oldPause := redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'since', ARGV[1], 'reason', ARGV[2], 'job', ARGV[3])
return 1
`)
	oldResume := func() {
		t.Helper()
		require.NoError(t, rdb.Del(ctx, key).Err())
	}
	durable := limiter.AttemptOptions{UnlessPaused: true, PauseDurable: true}
	lim := limiter.Limit{Rate: 1000, Burst: 1000}

	// A new worker starts: its pause refresh finds no state and restores "not paused" (no row
	// in Postgres). An old worker's spend-cap answer then pauses the credential.
	st, err := c.Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Unknown)
	restored, err := c.RestorePause(ctx, limiter.PauseState{})
	require.NoError(t, err)
	require.True(t, restored)
	n, err := oldPause.Run(ctx, rdb, []string{key}, t0.UnixMicro(), "rate_limited_no_retry_after", "job-old").Int()
	require.NoError(t, err)
	require.Equal(t, 1, n, "an old worker's spend cap starts the episode (and alerts)")
	st, err = c.Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused, "the credential is paused for every worker")
	require.Equal(t, "job-old", st.FirstJobID)

	// An old ctl resumes it: the credential is known not paused, not a state Redis lost.
	oldResume()
	st, err = c.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st, "an old resume is a resume")
	r, err := c.ReserveAttempt(ctx, lim, tokens.Cost{}, durable)
	require.NoError(t, err)
	require.False(t, r.PauseUnknown)
	require.True(t, r.Granted)

	// The same after a new resume.
	started, err := c.Pause(ctx, "rate_limited_no_retry_after", "job-new")
	require.NoError(t, err)
	require.True(t, started)
	was, err := c.Resume(ctx)
	require.NoError(t, err)
	require.True(t, was)
	n, err = oldPause.Run(ctx, rdb, []string{key}, t0.UnixMicro(), "rate_limited_no_retry_after", "job-old-2").Int()
	require.NoError(t, err)
	require.Equal(t, 1, n, "an old worker pauses a credential a new binary resumed")
	st, err = c.Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
}

// An automatic probe that is not sent is given back: the pause's next probe may go at once
// instead of an interval later. Only the probe released is: a stale grant releases nothing, nor
// does one whose pause has ended.
func TestGate_ReleaseProbe(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	gate := b.lim.Gate("sk-release-probe", "main")
	every := 30 * time.Second
	_, err := gate.Pause(ctx, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	b.clock.Advance(every)

	p, err := gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.True(t, p.Granted())
	again, err := gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.False(t, again.Granted(), "one probe per interval")

	require.NoError(t, gate.ReleaseProbe(ctx, p))
	b.clock.Advance(time.Millisecond)
	q, err := gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.True(t, q.Granted(), "the released probe's place is free at once")

	// p's grant is no longer the pause's probe: releasing it again leaves q's in place.
	require.NoError(t, gate.ReleaseProbe(ctx, p))
	again, err = gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.False(t, again.Granted(), "a stale release freed another caller's probe")

	// A probe whose pause ended is not released into the next episode.
	_, err = gate.Resume(ctx)
	require.NoError(t, err)
	_, err = gate.Pause(ctx, "rate_limited_no_retry_after", "job-2")
	require.NoError(t, err)
	require.NoError(t, gate.ReleaseProbe(ctx, q))
	again, err = gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.False(t, again.Granted(), "the new episode's first probe comes an interval after it began")
	require.NoError(t, gate.ReleaseProbe(ctx, limiter.PauseProbe{}), "a zero probe is no-op")
}

// TestGate_HeldProbe: a probe held with a job's slot (HoldProbe) is handed back to that job once
// (ReclaimProbe), to no other job, and not once released or replaced by the next interval's.
func TestGate_HeldProbe(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	gate := b.lim.Gate("sk-held-probe", "main")
	every := 30 * time.Second
	_, err := gate.Pause(ctx, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	b.clock.Advance(every)

	p, err := gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.True(t, p.Granted())
	require.NoError(t, gate.HoldProbe(ctx, p, "job-a"))
	b.clock.Advance(every / 3)
	other, err := gate.ReclaimProbe(ctx, "job-b")
	require.NoError(t, err)
	require.False(t, other.Granted(), "another job took the held probe")
	again, err := gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.False(t, again.Granted(), "the held probe is the interval's")
	mine, err := gate.ReclaimProbe(ctx, "job-a")
	require.NoError(t, err)
	require.Equal(t, p, mine, "the holder takes its probe back")
	mine, err = gate.ReclaimProbe(ctx, "job-a")
	require.NoError(t, err)
	require.False(t, mine.Granted(), "a held probe is taken back once")

	// Held, then released: not taken back.
	require.NoError(t, gate.HoldProbe(ctx, p, "job-a"))
	require.NoError(t, gate.ReleaseProbe(ctx, p))
	mine, err = gate.ReclaimProbe(ctx, "job-a")
	require.NoError(t, err)
	require.False(t, mine.Granted(), "a released probe was taken back")

	// Held, then replaced by the next interval's probe: not taken back.
	q, err := gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.True(t, q.Granted())
	require.NoError(t, gate.HoldProbe(ctx, q, "job-a"))
	b.clock.Advance(every)
	r, err := gate.TryProbe(ctx, every)
	require.NoError(t, err)
	require.True(t, r.Granted())
	mine, err = gate.ReclaimProbe(ctx, "job-a")
	require.NoError(t, err)
	require.False(t, mine.Granted(), "a probe the next interval's replaced was taken back")
	require.NoError(t, gate.HoldProbe(ctx, limiter.PauseProbe{}, "job-a"), "a zero probe is no-op")
}

// NowAndPaused answers in one round trip what Now and Paused answer: the limiter's clock (the
// injected one, or Redis TIME) and the pause state, in each state the pause can be in (none
// known, paused, resumed).
func TestGate_NowAndPausedIsNowAndPaused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	check := func(t *testing.T, g *limiter.Gate, wantNow func(got time.Time)) {
		t.Helper()
		now, got, err := g.NowAndPaused(ctx)
		require.NoError(t, err)
		want, err := g.Paused(ctx)
		require.NoError(t, err)
		require.Equal(t, want, got)
		wantNow(now)
	}

	b := setup(t, nil)
	g := b.lim.Gate("sk-now-paused", "main")
	onClock := func(got time.Time) { require.True(t, got.Equal(b.clock.Now()), "the injected clock: %v", got) }
	check(t, g, onClock)
	_, err := g.Pause(ctx, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	check(t, g, onClock)
	b.clock.Advance(time.Minute)
	_, err = g.Resume(ctx)
	require.NoError(t, err)
	check(t, g, onClock)

	// On Redis TIME.
	l, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	g = l.Gate("sk-now-paused", "main")
	_, err = g.Pause(ctx, "rate_limited_no_retry_after", "job-2")
	require.NoError(t, err)
	check(t, g, func(got time.Time) {
		ref, err := g.Now(ctx)
		require.NoError(t, err)
		require.WithinDuration(t, ref, got, time.Second, "Redis's clock")
	})
}
