package limiter_test

import (
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
)

// anthropicHeaders returns Anthropic's request rate-limit headers.
func anthropicHeaders(limit, remaining int, reset time.Time, layout string) http.Header {
	h := http.Header{}
	h.Set(limiter.HeaderAnthropicLimit, strconv.Itoa(limit))
	h.Set(limiter.HeaderAnthropicRemaining, strconv.Itoa(remaining))
	h.Set(limiter.HeaderAnthropicReset, reset.UTC().Format(layout))
	return h
}

// withDate adds the Date header of a response the provider sent when its clock read date.
func withDate(h http.Header, date time.Time) http.Header {
	h.Set("Date", date.UTC().Format(http.TimeFormat))
	return h
}

// openaiHeaders returns OpenAI's request rate-limit headers.
func openaiHeaders(limit, remaining int, reset string) http.Header {
	h := http.Header{}
	h.Set(limiter.HeaderOpenAILimit, strconv.Itoa(limit))
	h.Set(limiter.HeaderOpenAIRemaining, strconv.Itoa(remaining))
	h.Set(limiter.HeaderOpenAIReset, reset)
	return h
}

func TestCredential_Observe(t *testing.T) {
	t.Parallel()

	// at has a fractional second, so an exact reset is told apart from a truncated one.
	at := t0.Add(300 * time.Millisecond)

	for _, tc := range []struct {
		name string
		hdr  http.Header
		// want: the rate paced at is the lower bound: the deficit less one request over the
		// longest the refill can take.
		want limiter.Limit
	}{
		{
			// deficit 20 refilled in 2 s by the provider's clock, which may be 100 ms off ours
			name: "AnthropicExact",
			hdr:  anthropicHeaders(20, 0, at.Add(2*time.Second), time.RFC3339Nano),
			want: limiter.Limit{Rate: 19 / 2.1, Burst: 20},
		},
		{
			// reset truncated to 12:00:02: full within 2.7 s (2.8 with the clock skew)
			name: "AnthropicSeconds",
			hdr:  anthropicHeaders(20, 0, at.Add(2*time.Second), time.RFC3339),
			want: limiter.Limit{Rate: 19 / 2.8, Burst: 20},
		},
		{
			// The provider's clock is 1.5 s behind ours: its Date reads 11:59:58 (11:59:58.8,
			// truncated) and the bucket is full 2 s after its now. Measured from the Date, the
			// refill takes at most 2.8 s (the Date may be up to a second late): not 0.6 s, as ours
			// would say (a rate of 32/s, three times the provider's).
			name: "AnthropicDateClockBehind",
			hdr: withDate(anthropicHeaders(20, 0, at.Add(500*time.Millisecond), time.RFC3339Nano),
				at.Add(-1500*time.Millisecond)),
			want: limiter.Limit{Rate: 19 / 2.8, Burst: 20},
		},
		{
			// deficit 15 in 1.5 s, to the millisecond
			name: "OpenAIMillis",
			hdr:  openaiHeaders(20, 5, "1.5s"),
			want: limiter.Limit{Rate: 14 / 1.501, Burst: 20},
		},
		{
			// a whole-second duration may be truncated: full within 3 s
			name: "OpenAISeconds",
			hdr:  openaiHeaders(20, 0, "2s"),
			want: limiter.Limit{Rate: 19.0 / 3, Burst: 20},
		},
		{
			// deficit 1: remaining is rounded down, so the deficit may be as low as 1/2
			name: "OneRequestUsed",
			hdr:  openaiHeaders(60, 59, "1.2s"),
			want: limiter.Limit{Rate: 0.5 / 1.201, Burst: 60},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			b.clock.Advance(300 * time.Millisecond)
			c := b.lim.Gate("sk-"+tc.name, "main")
			o := limiter.ObservationFromHeaders(tc.hdr, 200, at, at)
			require.True(t, o.HeadersKnown)
			require.NoError(t, c.Observe(t.Context(), o))
			lim, src, err := b.lim2.Gate("sk-"+tc.name, "main").Current(t.Context())
			require.NoError(t, err)
			require.Equal(t, limiter.SourceLearned, src)
			require.Equal(t, tc.want.Burst, lim.Burst)
			require.InDelta(t, tc.want.Rate, lim.Rate, 1e-9)
		})
	}

	t.Run("FollowsChanges", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-changes", "main")
		b.clock.Advance(300 * time.Millisecond) // off the whole second: resets below are exact
		observe := func(limit, remaining int, toFull time.Duration) limiter.Limit {
			t.Helper()
			b.clock.Advance(time.Second)
			now := b.clock.Now()
			require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: now, StatusCode: 200,
				HeadersKnown: true, Limit: limit, Remaining: remaining, ResetAt: now.Add(toFull)}))
			lim, src, err := c.Current(t.Context())
			require.NoError(t, err)
			require.Equal(t, limiter.SourceLearned, src)
			return lim
		}
		near := func(want, got limiter.Limit) {
			t.Helper()
			require.Equal(t, want.Burst, got.Burst)
			require.InDelta(t, want.Rate, got.Rate, 1e-4)
		}
		// 20 at 10/s: the rate lies in 19/2..20/2.
		near(limiter.Limit{Rate: 9.5, Burst: 20}, observe(20, 0, 2*time.Second))
		// Another response raises the lower bound: 19/1.95.
		near(limiter.Limit{Rate: 19 / 1.95, Burst: 20}, observe(20, 0, 1950*time.Millisecond))
		// A response that proves less does not lower it: 18/1.85.
		near(limiter.Limit{Rate: 19 / 1.95, Burst: 20}, observe(20, 1, 1850*time.Millisecond))
		// Raised to 40 at 20/s: a new limit starts over.
		near(limiter.Limit{Rate: 19.5, Burst: 40}, observe(40, 0, 2*time.Second))
		// Rate raised to 40/s, same limit: 39 is above the upper bound 20, start over.
		near(limiter.Limit{Rate: 39, Burst: 40}, observe(40, 0, time.Second))
		// Rate lowered to 5/s, same limit: at most 5 is below the lower bound 39, start over.
		near(limiter.Limit{Rate: 39.0 / 8, Burst: 40}, observe(40, 0, 8*time.Second))
		// Lowered to 10 at 5/s.
		near(limiter.Limit{Rate: 4.5, Burst: 10}, observe(10, 0, 2*time.Second))

		// A 429 with Retry-After: the rate is capped 10% lower, and stays so although the next
		// response says 4.5 again.
		require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: b.clock.Now(), StatusCode: 429,
			RetryAfter: time.Second, HasRetryAfter: true}))
		lim, _, err := c.Current(t.Context())
		require.NoError(t, err)
		near(limiter.Limit{Rate: 4.05, Burst: 10}, lim)
		near(limiter.Limit{Rate: 4.05, Burst: 10}, observe(10, 0, 2*time.Second))
		// A new limit lifts the cap.
		near(limiter.Limit{Rate: 9.5, Burst: 20}, observe(20, 0, 2*time.Second))

		// Knowledge expires without responses.
		b.clock.Advance(limiter.DefaultLearnTTL + time.Second)
		_, src, err := c.Current(t.Context())
		require.NoError(t, err)
		require.Equal(t, limiter.SourceUnknown, src)
	})

	t.Run("ReserveUsesLearned", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-learned", "main")
		b.clock.Advance(300 * time.Millisecond)
		now := b.clock.Now()
		// A response saying 20 at 10/s, all 20 used.
		require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: now, StatusCode: 200,
			HeadersKnown: true, Limit: 20, Remaining: 0, ResetAt: now.Add(2 * time.Second)}))
		r, err := c.Reserve(t.Context(), limiter.Limit{})
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.Equal(t, limiter.SourceLearned, r.Source)
		require.Equal(t, 20, r.Limit.Burst)
		require.InDelta(t, 9.5, r.Limit.Rate, 1e-9)
		// The bucket is empty: the next request waits one spacing plus the phase margin.
		require.InDelta(t, 1.01/9.5+0.1, r.Wait.Seconds(), 2e-6)
		require.InDelta(t, 9.5, b.metric(t, "llmq_limiter_limit_requests_per_second", "main"), 1e-9)

		// The next slot (0.313 s) is beyond the horizon (250 ms): not handed out, ask again.
		r, err = c.Reserve(t.Context(), limiter.Limit{})
		require.NoError(t, err)
		require.False(t, r.Granted)
		require.Positive(t, r.Wait)
		require.LessOrEqual(t, r.Wait, time.Second)
	})
}

func TestCredential_Reserve_UnknownLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	id := "sk-unknown"
	creds := []*limiter.Gate{b.lim.Gate(id, "main"), b.lim2.Gate(id, "main")}

	// Fifty concurrent callers over two clients: exactly one probe goes out.
	reserveAll := func(n int) []limiter.Reservation {
		var (
			mu  sync.Mutex
			out []limiter.Reservation
			wg  sync.WaitGroup
		)
		for i := range n {
			wg.Go(func() {
				r, err := creds[i%2].Reserve(t.Context(), limiter.Limit{})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			})
		}
		wg.Wait()
		require.Len(t, out, n)
		return out
	}
	count := func(rs []limiter.Reservation, f func(limiter.Reservation) bool) int {
		n := 0
		for _, r := range rs {
			if f(r) {
				n++
			}
		}
		return n
	}
	rs := reserveAll(50)
	require.Equal(t, 1, count(rs, func(r limiter.Reservation) bool { return r.Granted && r.Probe }))
	require.Equal(t, 49, count(rs, func(r limiter.Reservation) bool {
		return !r.Granted && r.Wait == limiter.DefaultPollInterval && r.Source == limiter.SourceUnknown
	}))

	// Still unanswered a little later: still nobody else; waiters ask again at half the
	// probe's age.
	b.clock.Advance(time.Second)
	rs = reserveAll(10)
	require.Equal(t, 0, count(rs, func(r limiter.Reservation) bool { return r.Granted }))
	require.Equal(t, 10, count(rs, func(r limiter.Reservation) bool { return r.Wait == 500*time.Millisecond }))

	// The probe's answer: 20, 19 left. They go at once, not one more.
	b.clock.Advance(5 * time.Millisecond)
	now := b.clock.Now()
	require.NoError(t, creds[0].Observe(t.Context(), limiter.ObservationFromHeaders(
		anthropicHeaders(20, 19, now.Add(95*time.Millisecond), time.RFC3339Nano), 200, t0, now)))
	rs = reserveAll(30)
	require.Equal(t, 19, count(rs, func(r limiter.Reservation) bool { return r.Granted && r.Wait == 0 }))
	require.Equal(t, 11, count(rs, func(r limiter.Reservation) bool { return !r.Granted }))

	t.Run("ProbeExpires", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-lost-probe", "main")
		r, err := c.Reserve(t.Context(), limiter.Limit{})
		require.NoError(t, err)
		require.True(t, r.Probe)
		b.clock.Advance(limiter.DefaultProbeTTL)
		r, err = c.Reserve(t.Context(), limiter.Limit{})
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.True(t, r.Probe, "an unanswered probe is replaced after ProbeTTL")
		require.Equal(t, 2.0, b.metric(t, "llmq_limiter_probes_total", "main"))
	})
}

// learnedGate returns a gate of key whose rate was learned from one answer (20, of which 15
// left, full again in 2 s), its test bundle, and a function returning the limit it learned.
func learnedGate(t *testing.T, key string) (*limiter.Gate, *testBundle, func() limiter.Limit) {
	t.Helper()
	b := setup(t, nil)
	c := b.lim.Gate(key, "main")
	b.clock.Advance(300 * time.Millisecond)
	now := b.clock.Now()
	require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: now, StatusCode: 200,
		HeadersKnown: true, Limit: 20, Remaining: 15, ResetAt: now.Add(2 * time.Second)}))
	return c, b, func() limiter.Limit {
		t.Helper()
		lim, src, err := c.Current(t.Context())
		require.NoError(t, err)
		require.Equal(t, limiter.SourceLearned, src)
		return lim
	}
}

// TestCredential_OneCutPerOverload: the 429s of requests sent before a cut of the learned rate
// do not cut it again: sent together at the rate being corrected and refused together, they
// compounded it (here five: 0.9^5 of the rate instead of 0.9). A 429 of a request sent after the
// cut cuts again.
func TestCredential_OneCutPerOverload(t *testing.T) {
	t.Parallel()
	c, b, current := learnedGate(t, "sk-one-cut")
	rate := func() float64 { t.Helper(); return current().Rate }
	learned := rate()
	require.Positive(t, learned)
	tooMany := func(sent time.Time) {
		t.Helper()
		require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: b.clock.Now(), SentAt: sent,
			StatusCode: 429, RetryAfter: time.Second, HasRetryAfter: true}))
	}

	sent := b.clock.Now() // five requests sent together
	b.clock.Advance(50 * time.Millisecond)
	for range 5 {
		tooMany(sent)
		b.clock.Advance(time.Millisecond)
	}
	require.InDelta(t, learned*0.9, rate(), 1e-9, "the burst's five 429s cut the rate once")

	b.clock.Advance(2 * time.Second) // past the Retry-After
	sent = b.clock.Now()
	b.clock.Advance(50 * time.Millisecond)
	tooMany(sent)
	require.InDelta(t, learned*0.9*0.9, rate(), 1e-9, "a request sent after the cut, refused too, cuts again")

	// A 429 whose send time is unknown (it is taken as sent when answered) is a new overload.
	b.clock.Advance(time.Millisecond)
	tooMany(time.Time{})
	require.InDelta(t, learned*0.9*0.9*0.9, rate(), 1e-9)
}

// TestCredential_TooLargeRefusal: a 429 that refused the request for its size (OpenAI's "Request
// too large for … (TPM)", Observation.TooLarge) says nothing of the credential's rate: its
// Retry-After neither pushes the schedule back nor cuts the learned rate, while its rate-limit
// headers are learned as any answer's are. The same 429 without TooLarge does both.
func TestCredential_TooLargeRefusal(t *testing.T) {
	t.Parallel()
	c, b, rate := learnedGate(t, "sk-too-large")
	require.Positive(t, rate().Rate)

	// A too-large 429 with Retry-After, whose headers say the limit is now 40.
	b.clock.Advance(50 * time.Millisecond)
	now := b.clock.Now()
	require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: now, StatusCode: 429, TooLarge: true,
		RetryAfter: 30 * time.Second, HasRetryAfter: true,
		HeadersKnown: true, Limit: 40, Remaining: 30, ResetAt: now.Add(2 * time.Second)}))
	pb, err := c.PushBack(t.Context())
	require.NoError(t, err)
	require.False(t, pb.Active(), "pushed back: %s", pb.Reason())
	got := rate()
	require.Equal(t, 40, got.Burst, "the refusal's headers were not learned")
	require.InDelta(t, 9.0/2, got.Rate, 1e-9, "the rate was cut: a new limit's bounds, deficit 10 less one over 2 s")

	// The same 429, not for size: pushed back, and the rate cut by 10%.
	require.NoError(t, c.Observe(t.Context(), limiter.Observation{At: now, StatusCode: 429,
		RetryAfter: 30 * time.Second, HasRetryAfter: true,
		HeadersKnown: true, Limit: 40, Remaining: 30, ResetAt: now.Add(2 * time.Second)}))
	pb, err = c.PushBack(t.Context())
	require.NoError(t, err)
	require.True(t, pb.Active())
	require.InDelta(t, 0.9*9.0/2, rate().Rate, 1e-9)
}
