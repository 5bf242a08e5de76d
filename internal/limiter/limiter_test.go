package limiter_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
)

// herd reserves n slots concurrently from goroutines spread over both limiters (two Redis
// clients, as two processes would) and returns the sorted send times.
func herd(t *testing.T, b *testBundle, id string, n int, lim limiter.Limit, tick func()) []time.Time {
	t.Helper()
	creds := []*limiter.Gate{b.lim.Gate(id, "main"), b.lim2.Gate(id, "main")}
	var (
		mu    sync.Mutex
		sends []time.Time
		wg    sync.WaitGroup
	)
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if tick != nil {
				tick()
			}
			r, err := creds[i%2].Reserve(context.Background(), lim)
			if err != nil {
				errs <- err
				return
			}
			if !r.Granted {
				errs <- errNotGranted
				return
			}
			mu.Lock()
			sends = append(sends, r.SendAt)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	slices.SortFunc(sends, func(a, b time.Time) int { return a.Compare(b) })
	return sends
}

var errNotGranted = &notGrantedError{}

type notGrantedError struct{}

func (*notGrantedError) Error() string { return "configured limit not granted" }

// requireWithinBucket checks that the send times never exceed a token bucket of the given burst
// and rate that was full before the first: every window [a, b] holds at most
// burst + rate*(b-a) sends.
func requireWithinBucket(t *testing.T, sends []time.Time, burst int, rate float64) {
	t.Helper()
	for i := range sends {
		for j := i; j < len(sends); j++ {
			window := sends[j].Sub(sends[i]).Seconds()
			require.LessOrEqualf(t, float64(j-i+1), float64(burst)+rate*window+1e-9,
				"sends %d..%d within %.6fs exceed the bucket", i, j, window)
		}
	}
}

func TestCredential_Reserve(t *testing.T) {
	t.Parallel()

	t.Run("ConfiguredHerdTwoClients", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		sends := herd(t, b, "sk-herd", 100, limiter.Limit{Rate: 10, Burst: 20}, nil)
		require.Len(t, sends, 100)

		// Exact: 20 at once, then one every 1.01/10 s, the first of them after the 100 ms phase
		// margin.
		for k, s := range sends {
			want := t0
			if k >= 20 {
				want = t0.Add(100*time.Millisecond + time.Duration(k-19)*101*time.Millisecond)
			}
			require.InDeltaf(t, 0, s.Sub(want).Microseconds(), 1, "send %d at %v, want %v", k, s.Sub(t0), want.Sub(t0))
		}
		requireWithinBucket(t, sends, 20, 10)
		last := sends[99].Sub(t0).Seconds()
		require.GreaterOrEqual(t, last, 8.0)
		require.LessOrEqual(t, last, 8.0*1.025, "margins cost at most 2.5% of the 8 s floor")
		require.Equal(t, 10.0, b.metric(t, "llmq_limiter_limit_requests_per_second", "main"))
		require.Equal(t, 20.0, b.metric(t, "llmq_limiter_limit_burst_requests", "main"))
		require.Equal(t, 50.0, b.metric(t, "llmq_limiter_wait_seconds", "main"))
	})

	t.Run("ConfiguredHerdAdvancingClock", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		// Time moves while the herd reserves: 2 ms per call, 0.4 s in all.
		sends := herd(t, b, "sk-moving", 200, limiter.Limit{Rate: 10, Burst: 20},
			func() { b.clock.Advance(2 * time.Millisecond) })
		requireWithinBucket(t, sends, 20, 10)
		last := sends[len(sends)-1].Sub(t0).Seconds()
		require.Greater(t, last, 18.0)
		require.Less(t, last, 18.0*1.025)
	})

	t.Run("BucketRefillsWhileIdle", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-idle", "main")
		lim := limiter.Limit{Rate: 10, Burst: 20}
		for range 20 {
			r, err := c.Reserve(t.Context(), lim)
			require.NoError(t, err)
			require.Equal(t, time.Duration(0), r.Wait)
		}
		// One second later 9 requests have been refilled (at 0.101 s spacing); those refilled
		// more than the phase margin ago go at once, the 9th (refilled at 0.909 s) at 1.009 s.
		b.clock.Advance(time.Second)
		for range 8 {
			r, err := c.Reserve(t.Context(), lim)
			require.NoError(t, err)
			require.Equal(t, time.Duration(0), r.Wait)
		}
		r, err := c.Reserve(t.Context(), lim)
		require.NoError(t, err)
		require.Equal(t, 9*time.Millisecond, r.Wait)
	})

	t.Run("RedisClock", func(t *testing.T) {
		t.Parallel()
		l, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t)})
		require.NoError(t, err)
		c := l.Gate("sk-redis-clock", "main")
		before := time.Now()
		var last limiter.Reservation
		for range 3 {
			last, err = c.Reserve(t.Context(), limiter.Limit{Rate: 1, Burst: 2})
			require.NoError(t, err)
		}
		// Redis and this process share the machine's clock.
		require.WithinDuration(t, before, last.SendAt.Add(-last.Wait), time.Second)
		require.InDelta(t, (1110 * time.Millisecond).Seconds(), last.Wait.Seconds(), 0.5)
	})

	t.Run("InvalidLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-invalid", "main")
		for _, lim := range []limiter.Limit{{Rate: -1}, {Rate: 1, Burst: -1}} {
			_, err := c.Reserve(t.Context(), lim)
			require.ErrorContains(t, err, "invalid limit")
		}
	})

	t.Run("RetryAfterPushesBack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-pushback", "main")
		other := b.lim2.Gate("sk-pushback", "main")
		lim := limiter.Limit{Rate: 10, Burst: 20}
		r, err := c.Reserve(t.Context(), lim)
		require.NoError(t, err)
		require.True(t, t0.Equal(r.SendAt))

		b.clock.Advance(10 * time.Millisecond)
		require.NoError(t, c.Observe(t.Context(), limiter.Observation{
			At: b.clock.Now(), StatusCode: 429, RetryAfter: 3 * time.Second, HasRetryAfter: true,
			Seq: r.Seq,
		}))
		// Nobody, in any process, sends before At+RetryAfter; then the schedule resumes from
		// one request, with the phase margin.
		at := t0.Add(10*time.Millisecond + 3*time.Second)
		for k := range 3 {
			r, err := other.Reserve(t.Context(), lim)
			require.NoError(t, err)
			want := at.Add(100*time.Millisecond + time.Duration(k)*101*time.Millisecond)
			require.InDelta(t, 0, r.SendAt.Sub(want).Microseconds(), 1)
		}
		require.Equal(t, 1.0, b.metric(t, "llmq_limiter_retry_after_pushbacks_total", "main"))
	})
}

func TestCredential_Current(t *testing.T) {
	t.Parallel()

	t.Run("Configured", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-current", "main")
		lim, src, err := c.Current(t.Context())
		require.NoError(t, err)
		require.Equal(t, limiter.SourceUnknown, src)
		require.Equal(t, limiter.Limit{}, lim)

		_, err = c.Reserve(t.Context(), limiter.Limit{Rate: 2.5, Burst: 4})
		require.NoError(t, err)
		lim, src, err = b.lim2.Gate("sk-current", "other name").Current(t.Context())
		require.NoError(t, err)
		require.Equal(t, limiter.SourceConfigured, src)
		require.Equal(t, limiter.Limit{Rate: 2.5, Burst: 4}, lim)

		b.clock.Advance(limiter.DefaultLearnTTL + time.Second)
		_, src, err = c.Current(t.Context())
		require.NoError(t, err)
		require.Equal(t, limiter.SourceUnknown, src)
	})
}

func TestCredential_Keys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const id = "sk-ant-api03-SECRET-never-in-redis"
	c := b.lim.Gate(id, "main")
	ctx := t.Context()
	r, err := c.Reserve(ctx, limiter.Limit{})
	require.NoError(t, err)
	require.NoError(t, c.Observe(ctx, limiter.Observation{StatusCode: 200, HeadersKnown: true,
		Limit: 20, Remaining: 19, ResetAt: t0.Add(100 * time.Millisecond), Seq: r.Seq}))
	require.NoError(t, c.RecordAttempt(ctx))
	_, err = c.Pause(ctx, "spend cap", "job-1")
	require.NoError(t, err)

	rdb := redistest.Client(t)
	keys, err := rdb.Keys(ctx, b.prefix+"*").Result()
	require.NoError(t, err)
	sum := sha256.Sum256([]byte(id))
	tag := "{" + hex.EncodeToString(sum[:]) + "}"
	slices.Sort(keys)
	calls := slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return !strings.HasPrefix(k, b.prefix+tag+":rl:call:") })
	require.Len(t, calls, 1, "the granted probe's reply, kept for a retry of its call")
	keys = slices.DeleteFunc(keys, func(k string) bool { return slices.Contains(calls, k) })
	require.Equal(t, []string{b.prefix + tag + ":budget", b.prefix + tag + ":pause", b.prefix + tag + ":pause:known",
		b.prefix + tag + ":rl"}, keys)
	requireCallKeysExpire(t, rdb, calls)
	for _, k := range keys {
		if strings.HasSuffix(k, ":pause:known") {
			v, err := rdb.Get(ctx, k).Result()
			require.NoError(t, err)
			require.Equal(t, strconv.FormatInt(t0.UnixMicro(), 10), v, "the known flag names the episode")
			continue // like the pause, no TTL
		}
		vals, err := rdb.HGetAll(ctx, k).Result()
		require.NoError(t, err)
		for f, v := range vals {
			require.NotContains(t, f+v, "SECRET")
		}
		if !strings.HasSuffix(k, ":pause") {
			ttl, err := rdb.PTTL(ctx, k).Result()
			require.NoError(t, err)
			require.Positive(t, ttl, "%s must expire by itself", k)
		}
	}
}

func TestCredential_Acquire(t *testing.T) {
	t.Parallel()

	t.Run("WaitsForProbe", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-acquire", "main")
		probe, err := c.Reserve(t.Context(), limiter.Limit{})
		require.NoError(t, err)
		require.True(t, probe.Probe)

		done := make(chan limiter.Reservation, 1)
		go func() {
			r, err := b.lim2.Gate("sk-acquire", "main").Acquire(t.Context(), limiter.Limit{}, time.Second)
			if err != nil {
				r = limiter.Reservation{}
			}
			done <- r
		}()
		require.NoError(t, c.Observe(t.Context(), limiter.Observation{StatusCode: 200, HeadersKnown: true,
			Limit: 20, Remaining: 19, ResetAt: t0.Add(100 * time.Millisecond), Seq: probe.Seq}))
		select {
		case r := <-done:
			require.True(t, r.Granted)
			require.True(t, t0.Equal(r.SendAt))
			require.Equal(t, limiter.SourceLearned, r.Source)
		case <-time.After(30 * time.Second):
			t.Fatal("Acquire did not return after the probe's answer")
		}
	})

	t.Run("ReturnsLongWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-acquire-long", "main")
		_, err := c.Reserve(t.Context(), limiter.Limit{})
		require.NoError(t, err)
		r, err := c.Acquire(t.Context(), limiter.Limit{}, time.Millisecond)
		require.NoError(t, err)
		require.False(t, r.Granted)
		require.Equal(t, limiter.DefaultPollInterval, r.Wait)
	})

	t.Run("Canceled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-acquire-cancel", "main")
		_, err := c.Reserve(t.Context(), limiter.Limit{})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err = c.Acquire(ctx, limiter.Limit{}, time.Second)
		require.ErrorIs(t, err, context.Canceled)
	})
}

func TestNew(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	for _, tc := range []struct {
		cfg   limiter.Config
		field string
	}{
		{limiter.Config{RateMargin: 2}, "RateMargin"},
		{limiter.Config{LearnTTL: time.Millisecond}, "LearnTTL"},
		{limiter.Config{PollInterval: time.Microsecond}, "PollInterval"},
		{limiter.Config{Budget: limiter.Budget{Ratio: -1}}, "Budget.Ratio"},
		{limiter.Config{Budget: limiter.Budget{Window: time.Millisecond}}, "Budget.Window"},
		{limiter.Config{Budget: limiter.Budget{Buckets: 1000}}, "Budget.Buckets"},
	} {
		_, err := limiter.New(rdb, &tc.cfg)
		require.ErrorContains(t, err, tc.field)
	}
	_, err := limiter.New(nil, nil)
	require.Error(t, err)
	l, err := limiter.New(rdb, nil)
	require.NoError(t, err)
	require.NotNil(t, l)
}

// TestGate_Now: the gate's clock is the one its scripts read, and Reservation.SendAt is on:
// the injected clock, or else Redis TIME (the test host's clock here, as Redis runs beside it).
func TestGate_Now(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	g := b.lim.Gate("sk-now", "main")
	now, err := g.Now(t.Context())
	require.NoError(t, err)
	require.Equal(t, t0, now.UTC())
	r, err := g.Reserve(t.Context(), limiter.Limit{Rate: 1, Burst: 1})
	require.NoError(t, err)
	require.Equal(t, now.Add(r.Wait), r.SendAt)

	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: b.prefix})
	require.NoError(t, err)
	now, err = lim.Gate("sk-now", "main").Now(t.Context())
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), now, 2*time.Second, "Redis TIME")
}

// requireCallKeysExpire checks the keys that keep reservations' replies for a retry of their
// calls: no secret in them, and each expires within redisscript.CallKeep.
func requireCallKeysExpire(t *testing.T, rdb *redis.Client, keys []string) {
	t.Helper()
	for _, k := range keys {
		v, err := rdb.Get(t.Context(), k).Result()
		require.NoError(t, err)
		require.NotContains(t, v, "SECRET")
		ttl, err := rdb.PTTL(t.Context(), k).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, "%s must expire by itself", k)
		require.LessOrEqual(t, ttl, redisscript.CallKeep)
	}
}
