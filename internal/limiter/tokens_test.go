package limiter_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

// tokenLim is a request limit that never binds plus 6,000 input tokens per minute: 100 tokens/s,
// one token every 10.1 ms with the 1% rate margin, the whole bucket in 60.6 s. (The request
// bucket is charged at the slot's time: its burst must span the token waits not to bind.)
var tokenLim = limiter.Limit{Rate: 1000, Burst: 1000000, InputTokensPerMinute: 6000}

// tokT is tokenLim's spacing of one input token.
const tokT = 10100 * time.Microsecond

// noHorizon disables the token horizon so that every slot is handed out at once.
func noHorizon(c *limiter.Config) { c.TokenHorizon = -1 }

func requireAt(t *testing.T, want time.Time, r limiter.Reservation) {
	t.Helper()
	require.True(t, r.Granted)
	require.InDeltaf(t, 0, r.SendAt.Sub(want).Microseconds(), 1, "send at %v, want %v", r.SendAt.Sub(t0), want.Sub(t0))
}

func in(n int) tokens.Cost { return tokens.Cost{InputTokens: n} }

func TestCredential_ReserveCost(t *testing.T) {
	t.Parallel()

	t.Run("ConfiguredExactTwoClients", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		creds := []*limiter.Gate{b.lim.Gate("sk-tok", "main"), b.lim2.Gate("sk-tok", "main")}
		// The full bucket holds six requests of 1,000 tokens: they go at once.
		for k := range 6 {
			r, err := creds[k%2].ReserveCost(t.Context(), tokenLim, in(1000))
			require.NoError(t, err)
			requireAt(t, t0, r)
			require.Positive(t, r.Grant)
			require.Equal(t, limiter.TokenBucket{PerMinute: 6000, Rate: 100, Source: limiter.SourceConfigured}, r.Tokens.Input)
			require.Equal(t, limiter.SourceUnknown, r.Tokens.Output.Source)
		}
		// Then one every 1,000 tokens (10.1 s), after the phase margin.
		for k := range 3 {
			r, err := creds[k%2].ReserveCost(t.Context(), tokenLim, in(1000))
			require.NoError(t, err)
			requireAt(t, t0.Add(time.Duration(k+1)*1000*tokT+100*time.Millisecond), r)
		}
		require.Equal(t, 5000.0, b.metric(t, "llmq_limiter_tokens_reserved_total", "main"))
		require.Equal(t, 6000.0, b.metric(t, "llmq_limiter_limit_tokens_per_minute", "main"))
	})

	t.Run("LargerCostWaitsLonger", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		c := b.lim.Gate("sk-tok-mixed", "main")
		r, err := c.ReserveCost(t.Context(), tokenLim, in(5000))
		require.NoError(t, err)
		requireAt(t, t0, r)
		// 1,000 left: 3,000 more need 2,000 refilled.
		r, err = c.ReserveCost(t.Context(), tokenLim, in(3000))
		require.NoError(t, err)
		requireAt(t, t0.Add(2000*tokT+100*time.Millisecond), r)
	})

	t.Run("OutputAndCombinedBuckets", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		c := b.lim.Gate("sk-tok-out", "main")
		// 600 output tokens per minute (10/s); the output allowance is what binds.
		lim := limiter.Limit{Rate: 1000, Burst: 1000000, InputTokensPerMinute: 6000, OutputTokensPerMinute: 600}
		cost := tokens.Cost{InputTokens: 100, OutputTokens: 300}
		for range 2 {
			r, err := c.ReserveCost(t.Context(), lim, cost)
			require.NoError(t, err)
			requireAt(t, t0, r)
		}
		r, err := c.ReserveCost(t.Context(), lim, cost)
		require.NoError(t, err)
		requireAt(t, t0.Add(300*101*time.Millisecond+100*time.Millisecond), r)

		// A combined bucket is charged input + output.
		c = b.lim.Gate("sk-tok-combined", "main")
		lim = limiter.Limit{Rate: 1000, Burst: 1000000, TokensPerMinute: 6000}
		r, err = c.ReserveCost(t.Context(), lim, tokens.Cost{InputTokens: 4000, OutputTokens: 2000})
		require.NoError(t, err)
		requireAt(t, t0, r)
		r, err = c.ReserveCost(t.Context(), lim, tokens.Cost{InputTokens: 500, OutputTokens: 500})
		require.NoError(t, err)
		requireAt(t, t0.Add(1000*tokT+100*time.Millisecond), r)
	})

	t.Run("ReserveIgnoresTokens", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		c := b.lim.Gate("sk-tok-plain", "main")
		_, err := c.ReserveCost(t.Context(), tokenLim, in(6000))
		require.NoError(t, err)
		// Reserve and a zero cost take no tokens: the empty token bucket does not delay them.
		r, err := c.Reserve(t.Context(), tokenLim)
		require.NoError(t, err)
		requireAt(t, t0, r)
		require.Zero(t, r.Grant)
		require.Equal(t, limiter.TokenBuckets{}, r.Tokens)
		r, err = c.ReserveCost(t.Context(), tokenLim, tokens.Cost{})
		require.NoError(t, err)
		requireAt(t, t0, r)
		require.Zero(t, r.Grant)
	})

	t.Run("UnknownTokenLimitsDoNotLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		c := b.lim.Gate("sk-tok-unknown", "main")
		for range 3 {
			r, err := c.ReserveCost(t.Context(), limiter.Limit{Rate: 10, Burst: 20}, in(1_000_000))
			require.NoError(t, err)
			requireAt(t, t0, r)
			require.Zero(t, r.Grant)
			require.Equal(t, limiter.SourceUnknown, r.Tokens.Input.Source)
		}
	})

	t.Run("RequestBucketStillBinds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-tok-req", "main")
		// Tokens plenty, requests 10/s burst 2: the request schedule, unchanged, and no refusals.
		lim := limiter.Limit{Rate: 10, Burst: 2, InputTokensPerMinute: 600000}
		for k := range 30 {
			r, err := c.ReserveCost(t.Context(), lim, in(10))
			require.NoError(t, err)
			want := t0
			if k >= 2 {
				want = t0.Add(100*time.Millisecond + time.Duration(k-1)*101*time.Millisecond)
			}
			requireAt(t, want, r)
		}
	})

	t.Run("Invalid", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-tok-invalid", "main")
		_, err := c.ReserveCost(t.Context(), limiter.Limit{InputTokensPerMinute: -1}, in(1))
		require.ErrorContains(t, err, "invalid limit")
		_, err = c.Reserve(t.Context(), limiter.Limit{TokensPerMinute: -1})
		require.ErrorContains(t, err, "invalid limit")
		_, err = c.ReserveCost(t.Context(), tokenLim, in(-1))
		require.ErrorContains(t, err, "invalid cost")
		require.ErrorContains(t, c.Reconcile(t.Context(), 1, tokens.Cost{OutputTokens: -1}), "invalid cost")
	})
}

func TestCredential_ReserveCost_TooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, noHorizon)
	c := b.lim.Gate("sk-tok-large", "main")
	lim := limiter.Limit{Rate: 1, Burst: 1, InputTokensPerMinute: 6000, OutputTokensPerMinute: 600, TokensPerMinute: 6500}
	for _, tc := range []struct {
		cost tokens.Cost
		want tokens.TooLargeError
	}{
		{in(6001), tokens.TooLargeError{Bucket: tokens.BucketInput, Cost: 6001, Capacity: 6000}},
		{tokens.Cost{OutputTokens: 601}, tokens.TooLargeError{Bucket: tokens.BucketOutput, Cost: 601, Capacity: 600}},
		{tokens.Cost{InputTokens: 6000, OutputTokens: 600}, tokens.TooLargeError{Bucket: tokens.BucketTokens, Cost: 6600, Capacity: 6500}},
	} {
		require.Equal(t, &tc.want, lim.CheckCost(tc.cost))
		require.Equal(t, &tc.want, c.CheckCost(t.Context(), lim, tc.cost))
		_, err := c.ReserveCost(t.Context(), lim, tc.cost)
		var tl *tokens.TooLargeError
		require.ErrorAs(t, err, &tl)
		require.Equal(t, tc.want, *tl)
		require.ErrorIs(t, err, tokens.ErrTooLarge)
		require.ErrorContains(t, err, "can never be sent")
	}
	require.NoError(t, lim.CheckCost(tokens.Cost{InputTokens: 5900, OutputTokens: 600}))

	// Nothing was reserved: neither the request slot (1 request, burst 1) nor tokens.
	r, err := c.ReserveCost(t.Context(), lim, tokens.Cost{InputTokens: 5900, OutputTokens: 600})
	require.NoError(t, err)
	requireAt(t, t0, r)

	t.Run("ScaledEstimateTakesTheWholeBucket", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		c := b.lim.Gate("sk-tok-least", "main")
		// Scaled up, 7,500 would not fit 6,000; unscaled, 6,000 does: it takes the whole bucket.
		cost := tokens.Cost{InputTokens: 7500, MinInputTokens: 6000}
		require.NoError(t, tokenLim.CheckCost(cost))
		r, err := c.ReserveCost(t.Context(), tokenLim, cost)
		require.NoError(t, err)
		requireAt(t, t0, r)
		next, err := c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		requireAt(t, t0.Add(1000*tokT+100*time.Millisecond), next)
		// Reconciled against the 6,000 charged: 5,000 used, 1,000 back.
		require.NoError(t, c.Reconcile(t.Context(), r.Grant, in(5000)))
		next, err = c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		requireAt(t, t0.Add(1000*tokT+100*time.Millisecond), next)

		cost.MinInputTokens = 6001
		want := &tokens.TooLargeError{Bucket: tokens.BucketInput, Cost: 6001, Capacity: 6000}
		require.Equal(t, want, tokenLim.CheckCost(cost))
		_, err = c.ReserveCost(t.Context(), tokenLim, cost)
		require.Equal(t, want, err)
	})

	t.Run("Learned", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-tok-large-learned", "main")
		require.NoError(t, c.CheckCost(t.Context(), limiter.Limit{}, in(50000)))
		require.NoError(t, c.Observe(t.Context(), limiter.Observation{StatusCode: 200,
			InputTokens: limiter.TokenObservation{Known: true, Limit: 40000, Remaining: 40000}}))
		err := b.lim2.Gate("sk-tok-large-learned", "main").CheckCost(t.Context(), limiter.Limit{}, in(50000))
		learned := &tokens.TooLargeError{Bucket: tokens.BucketInput, Cost: 50000, Capacity: 40000, Learned: true}
		require.Equal(t, learned, err)
		// A configured limit wins over the learned one.
		require.NoError(t, c.CheckCost(t.Context(), limiter.Limit{InputTokensPerMinute: 60000}, in(50000)))
		_, err = c.ReserveCost(t.Context(), limiter.Limit{Rate: 1, Burst: 1}, in(50000))
		require.Equal(t, learned, err, "the reservation says the limit was learned too")
	})
}

func TestCredential_Reconcile(t *testing.T) {
	t.Parallel()

	t.Run("RefundAndCharge", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		c, other := b.lim.Gate("sk-rec", "main"), b.lim2.Gate("sk-rec", "main")
		var grants []int64
		for range 6 {
			r, err := c.ReserveCost(t.Context(), tokenLim, in(1000))
			require.NoError(t, err)
			grants = append(grants, r.Grant)
		}
		// The first request used 400 tokens, not 1,000: 600 come back, the next slot is 600
		// tokens (6.06 s) earlier than without the refund.
		require.NoError(t, other.Reconcile(t.Context(), grants[0], in(400)))
		r, err := other.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		requireAt(t, t0.Add(400*tokT+100*time.Millisecond), r)

		// The second used 1,500: 500 more are charged, and the next slot moves 500 tokens later.
		require.NoError(t, c.Reconcile(t.Context(), grants[1], in(1500)))
		r, err = c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		requireAt(t, t0.Add(1900*tokT+100*time.Millisecond), r)

		// A grant is reconciled once: again, it changes nothing.
		require.NoError(t, c.Reconcile(t.Context(), grants[0], in(0)))
		require.NoError(t, c.Reconcile(t.Context(), grants[1], in(0)))
		require.NoError(t, c.Reconcile(t.Context(), 0, in(0)))
		require.NoError(t, c.Reconcile(t.Context(), 1<<40, in(0)))
		r, err = c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		requireAt(t, t0.Add(2900*tokT+100*time.Millisecond), r)
		// Metrics: lim has them; one reservation and the first reconcile went through lim2.
		require.Equal(t, 8000.0, b.metric(t, "llmq_limiter_tokens_reserved_total", "main"))
		require.Equal(t, 1500.0, b.metric(t, "llmq_limiter_tokens_reported_total", "main"))
	})

	t.Run("OutputTrueUp", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		c := b.lim.Gate("sk-rec-out", "main")
		lim := limiter.Limit{Rate: 1000, Burst: 1000000, OutputTokensPerMinute: 600}
		r1, err := c.ReserveCost(t.Context(), lim, tokens.Cost{InputTokens: 10, OutputTokens: 400})
		require.NoError(t, err)
		r2, err := c.ReserveCost(t.Context(), lim, tokens.Cost{InputTokens: 10, OutputTokens: 200})
		require.NoError(t, err)
		requireAt(t, t0, r2)
		// The first reply was 100 tokens long: 300 of its max_tokens come back.
		require.NoError(t, c.Reconcile(t.Context(), r1.Grant, tokens.Cost{InputTokens: 10, OutputTokens: 100}))
		r, err := c.ReserveCost(t.Context(), lim, tokens.Cost{OutputTokens: 400})
		require.NoError(t, err)
		requireAt(t, t0.Add(100*101*time.Millisecond+100*time.Millisecond), r)
	})

	t.Run("RefundNeverFreesALaterSlotsTokens", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		c := b.lim.Gate("sk-rec-later", "main")
		x, err := c.ReserveCost(t.Context(), tokenLim, in(6000))
		require.NoError(t, err)
		requireAt(t, t0, x)
		// Y needs the whole bucket again: it goes once the bucket is full, at 60.6 s.
		y, err := c.ReserveCost(t.Context(), tokenLim, in(6000))
		require.NoError(t, err)
		requireAt(t, t0.Add(6000*tokT+100*time.Millisecond), y)
		// X used only 1,000, but Y still empties the bucket when it goes: after Y, nothing
		// changes. Z waits for 1,000 tokens after Y.
		require.NoError(t, c.Reconcile(t.Context(), x.Grant, in(1000)))
		z, err := c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		requireAt(t, t0.Add(7000*tokT+100*time.Millisecond), z)
	})
}

func TestCredential_ReserveCost_Horizon(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	c, other := b.lim.Gate("sk-hz", "main"), b.lim2.Gate("sk-hz", "main")
	var grants []int64
	for range 6 {
		r, err := c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		requireAt(t, t0, r)
		grants = append(grants, r.Grant)
	}
	// The 7th is pushed 10.2 s ahead, beyond the 1 s horizon: granted, as nobody else is.
	r, err := other.ReserveCost(t.Context(), tokenLim, in(1000))
	require.NoError(t, err)
	requireAt(t, t0.Add(1000*tokT+100*time.Millisecond), r)
	// The 8th would be too: refused while the 7th is pending, ask again within a second.
	r, err = c.ReserveCost(t.Context(), tokenLim, in(1000))
	require.NoError(t, err)
	require.False(t, r.Granted)
	require.Zero(t, r.Grant)
	require.Equal(t, time.Second, r.Wait)
	// Meanwhile the first six turn out to have used 500 each: the refunds apply to the 8th,
	// which now fits at once (the 7th keeps its tokens).
	for _, g := range grants {
		require.NoError(t, other.Reconcile(t.Context(), g, in(500)))
	}
	b.clock.Advance(time.Second)
	r, err = c.ReserveCost(t.Context(), tokenLim, in(1000))
	require.NoError(t, err)
	requireAt(t, t0.Add(time.Second), r)

	t.Run("NextPendingSlotWhenDue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		c := b.lim.Gate("sk-hz2", "main")
		_, err := c.ReserveCost(t.Context(), tokenLim, in(6000))
		require.NoError(t, err)
		r, err := c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		tail := t0.Add(1000*tokT + 100*time.Millisecond)
		requireAt(t, tail, r)
		// Refused until the pending slot is within the horizon, then the next one is handed out.
		b.clock.Advance(tail.Add(-time.Second).Sub(t0) - time.Millisecond)
		r, err = c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		require.False(t, r.Granted)
		require.Equal(t, limiter.DefaultPollInterval, r.Wait)
		b.clock.Advance(time.Millisecond)
		r, err = c.ReserveCost(t.Context(), tokenLim, in(1000))
		require.NoError(t, err)
		requireAt(t, t0.Add(2000*tokT+100*time.Millisecond), r)
	})
}

func TestCredential_Observe_Tokens(t *testing.T) {
	t.Parallel()
	// at has a fractional second, so an exact reset is told apart from a truncated one.
	at := t0.Add(300 * time.Millisecond)
	anthropic := func(kind string, limit, remaining int, reset time.Time) http.Header {
		h := http.Header{}
		p := "anthropic-ratelimit-" + kind + "-tokens-"
		h.Set(p+"limit", strconv.Itoa(limit))
		h.Set(p+"remaining", strconv.Itoa(remaining))
		h.Set(p+"reset", reset.UTC().Format(time.RFC3339Nano))
		return h
	}
	observe := func(t *testing.T, b *testBundle, id string, h http.Header) limiter.TokenBuckets {
		t.Helper()
		o := limiter.ObservationFromHeaders(h, 200, at, at)
		require.NoError(t, b.lim.Gate(id, "main").Observe(t.Context(), o))
		cur, err := b.lim2.Gate(id, "main").CurrentTokenBuckets(t.Context())
		require.NoError(t, err)
		return cur
	}

	for _, tc := range []struct {
		name string
		hdr  http.Header
		want limiter.TokenBuckets
	}{
		{
			// 40,000 per minute: at least 666.7/s. The reset proves more: the deficit 2,000 (at
			// least 1,500, remaining being rounded to the thousand) refilled in 300 ms (+100 ms
			// of clock skew): 3,750/s.
			name: "AnthropicInputFromHeaders",
			hdr:  anthropic("input", 40000, 38000, at.Add(300*time.Millisecond)),
			want: limiter.TokenBuckets{Input: limiter.TokenBucket{PerMinute: 40000, Rate: 3750, Source: limiter.SourceLearned}},
		},
		{
			// The reset proves little (500 in 10.1 s): the per-minute rate, 8000/60.
			name: "AnthropicOutputPerMinute",
			hdr:  anthropic("output", 8000, 7000, at.Add(10*time.Second)),
			want: limiter.TokenBuckets{Output: limiter.TokenBucket{PerMinute: 8000, Rate: 8000.0 / 60, Source: limiter.SourceLearned}},
		},
		{
			// OpenAI's combined bucket; remaining exact (999 at least) in 401 ms: 2,491/s, less than
			// the per-minute 2,500/s.
			name: "OpenAICombined",
			hdr: func() http.Header {
				h := http.Header{}
				h.Set(limiter.HeaderOpenAILimitTokens, "150000")
				h.Set(limiter.HeaderOpenAIRemainingTokens, "149000")
				h.Set(limiter.HeaderOpenAIResetTokens, "400ms")
				return h
			}(),
			want: limiter.TokenBuckets{Combined: limiter.TokenBucket{PerMinute: 150000, Rate: 2500, Source: limiter.SourceLearned}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, nil)
			b.clock.Advance(300 * time.Millisecond)
			got := observe(t, b, "sk-"+tc.name, tc.hdr)
			for _, p := range []*limiter.TokenBucket{&tc.want.Input, &tc.want.Output, &tc.want.Combined, &got.Input, &got.Output, &got.Combined} {
				if p.Source == "" {
					p.Source = limiter.SourceUnknown
				}
			}
			require.InDelta(t, tc.want.Input.Rate, got.Input.Rate, 1e-9)
			require.InDelta(t, tc.want.Output.Rate, got.Output.Rate, 1e-9)
			require.InDelta(t, tc.want.Combined.Rate, got.Combined.Rate, 1e-9)
			tc.want.Input.Rate, tc.want.Output.Rate, tc.want.Combined.Rate = 0, 0, 0
			got.Input.Rate, got.Output.Rate, got.Combined.Rate = 0, 0, 0
			require.Equal(t, tc.want, got)
		})
	}

	t.Run("ScheduleHoldsWhatTheProviderHeld", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.clock.Advance(300 * time.Millisecond)
		// The provider says 10,000 of 40,000 remain (±500) and refills at 40,000/60 s: our
		// schedule holds at least 29,500 from the send on.
		got := observe(t, b, "sk-sync", anthropic("input", 40000, 10000, at.Add(45*time.Second)))
		require.InDelta(t, 40000.0/60, got.Input.Rate, 1e-9)
		c := b.lim2.Gate("sk-sync", "main")
		r, err := c.ReserveCost(t.Context(), limiter.Limit{Rate: 100, Burst: 100}, in(20000))
		require.NoError(t, err)
		T := 60 / 40000.0 * 1.01 // seconds per token
		requireAt(t, at.Add(time.Duration((9500*T+0.1)*float64(time.Second))), r)
	})

	t.Run("SyncKeepsGrantsTheProviderHadNotSeen", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		b.clock.Advance(300 * time.Millisecond)
		id := "sk-pending"
		observe(t, b, id, anthropic("input", 40000, 40000, at))
		c := b.lim2.Gate(id, "main")
		reqLim := limiter.Limit{Rate: 100, Burst: 100}
		a, err := c.ReserveCost(t.Context(), reqLim, in(1000))
		require.NoError(t, err)
		_, err = c.ReserveCost(t.Context(), reqLim, in(5000))
		require.NoError(t, err)
		// A's answer: 30,000 used (±500; someone else shares the key). B's 5,000 were granted
		// after A and not yet seen by the provider: the schedule holds 29,500 + 5,000.
		o := limiter.ObservationFromHeaders(anthropic("input", 40000, 10000, at.Add(45*time.Second)), 200, at, at)
		o.Grant = a.Grant
		require.NoError(t, b.lim.Gate(id, "main").Observe(t.Context(), o))
		r, err := c.ReserveCost(t.Context(), reqLim, in(20000))
		require.NoError(t, err)
		T := 60 / 40000.0 * 1.01 // seconds per token
		requireAt(t, at.Add(time.Duration((14500*T+0.1)*float64(time.Second))), r)
	})

	t.Run("ConfiguredIsNotSynced", func(t *testing.T) {
		t.Parallel()
		b := setup(t, noHorizon)
		b.clock.Advance(300 * time.Millisecond)
		c := b.lim.Gate("sk-configured", "main")
		_, err := c.ReserveCost(t.Context(), tokenLim, in(1))
		require.NoError(t, err)
		observe(t, b, "sk-configured", anthropic("input", 6000, 0, at.Add(time.Minute)))
		r, err := c.ReserveCost(t.Context(), tokenLim, in(5000))
		require.NoError(t, err)
		requireAt(t, at, r)
	})

	t.Run("FollowsChangesAndExpires", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.clock.Advance(300 * time.Millisecond)
		got := observe(t, b, "sk-change", anthropic("input", 40000, 38000, at.Add(300*time.Millisecond)))
		require.InDelta(t, 3750, got.Input.Rate, 1e-9)
		// A new limit starts afresh: 80,000 per minute, nothing proven beyond it.
		got = observe(t, b, "sk-change", anthropic("input", 80000, 80000, at))
		require.Equal(t, limiter.TokenBucket{PerMinute: 80000, Rate: 80000.0 / 60, Source: limiter.SourceLearned}, got.Input)
		b.clock.Advance(limiter.DefaultLearnTTL + time.Second)
		cur, err := b.lim.Gate("sk-change", "main").CurrentTokenBuckets(t.Context())
		require.NoError(t, err)
		require.Equal(t, limiter.SourceUnknown, cur.Input.Source)
	})

	t.Run("RequestLimitUnchanged", func(t *testing.T) {
		t.Parallel()
		// Token headers alongside request headers: the request limit learns exactly as alone.
		b := setup(t, nil)
		b.clock.Advance(300 * time.Millisecond)
		h := openaiHeaders(20, 5, "1.5s")
		for k, v := range anthropic("input", 40000, 38000, at.Add(time.Second)) {
			h[k] = v
		}
		observe(t, b, "sk-both", h)
		lim, src, err := b.lim.Gate("sk-both", "main").Current(t.Context())
		require.NoError(t, err)
		require.Equal(t, limiter.SourceLearned, src)
		require.Equal(t, limiter.Limit{Rate: 14 / 1.501, Burst: 20}, limiter.Limit{Rate: lim.Rate, Burst: lim.Burst})
	})
}

// TestCredential_ReserveCost_NeverExceedsBuckets runs random token costs from goroutines over two
// Redis clients, with the clock moving and refunds arriving, and checks the handed-out send times
// against the provider's bucket charged what the requests really cost.
func TestCredential_ReserveCost_NeverExceedsBuckets(t *testing.T) {
	t.Parallel()
	for name, horizon := range map[string]time.Duration{"NoHorizon": -1, "DefaultHorizon": 0} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *limiter.Config) { c.TokenHorizon = horizon })
			creds := []*limiter.Gate{b.lim.Gate("sk-prop", "main"), b.lim2.Gate("sk-prop", "main")}
			lim := limiter.Limit{Rate: 1000, Burst: 1000000, InputTokensPerMinute: 6000, OutputTokensPerMinute: 3000}
			type sent struct {
				at   time.Time
				cost tokens.Cost // what the provider charged
			}
			var (
				mu    sync.Mutex
				sends []sent
				wg    sync.WaitGroup
			)
			errs := make(chan error, 64)
			for g := range 8 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					c := creds[g%2]
					for range 20 {
						cost := tokens.Cost{InputTokens: 1 + rng.IntN(3000), OutputTokens: 1 + rng.IntN(1500)}
						var r limiter.Reservation
						var err error
						for tries := 0; ; tries++ {
							b.clock.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
							if r, err = c.ReserveCost(context.Background(), lim, cost); err != nil || r.Granted {
								break
							}
							if tries > 1000 {
								err = errors.New("never granted")
								break
							}
							b.clock.Advance(r.Wait) // wait as told (the other goroutines' waits add up too)
						}
						if err != nil {
							errs <- err
							return
						}
						// The provider charges the real cost: at most what was reserved, which
						// the limiter learns later.
						actual := tokens.Cost{InputTokens: rng.IntN(cost.InputTokens + 1), OutputTokens: rng.IntN(cost.OutputTokens + 1)}
						mu.Lock()
						sends = append(sends, sent{r.SendAt, actual})
						mu.Unlock()
						if err := c.Reconcile(context.Background(), r.Grant, actual); err != nil {
							errs <- err
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Len(t, sends, 160)
			slices.SortFunc(sends, func(a, b sent) int { return a.at.Compare(b.at) })
			// Every window [i, j] of sends fits a bucket full at i: capacity + refill.
			for i := range sends {
				var sumIn, sumOut int
				for j := i; j < len(sends); j++ {
					sumIn += sends[j].cost.InputTokens
					sumOut += sends[j].cost.OutputTokens
					w := sends[j].at.Sub(sends[i].at).Seconds()
					require.LessOrEqualf(t, float64(sumIn), 6000+100*w+1e-6, "input sends %d..%d within %.3fs", i, j, w)
					require.LessOrEqualf(t, float64(sumOut), 3000+50*w+1e-6, "output sends %d..%d within %.3fs", i, j, w)
				}
			}
		})
	}
}

func TestCredential_TokenKeys(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	const id = "sk-ant-api03-SECRET-tokens"
	c := b.lim.Gate(id, "main")
	r, err := c.ReserveCost(t.Context(), tokenLim, tokens.Cost{InputTokens: 10, OutputTokens: 5})
	require.NoError(t, err)
	require.NoError(t, c.Observe(t.Context(), limiter.Observation{StatusCode: 200,
		OutputTokens: limiter.TokenObservation{Known: true, Limit: 8000, Remaining: 7000}}))
	_, err = c.ReserveCost(t.Context(), tokenLim, tokens.Cost{InputTokens: 10, OutputTokens: 5})
	require.NoError(t, err)
	require.NoError(t, c.Reconcile(t.Context(), r.Grant, tokens.Cost{InputTokens: 10, OutputTokens: 1}))
	rdb := redistest.Client(t)
	keys, err := rdb.Keys(t.Context(), b.prefix+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 3) // :rl, :tk, :tkg
	for _, k := range keys {
		vals, err := rdb.HGetAll(t.Context(), k).Result()
		require.NoError(t, err)
		for f, v := range vals {
			require.NotContains(t, f+v, "SECRET")
		}
		ttl, err := rdb.PTTL(t.Context(), k).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, "%s must expire by itself", k)
	}
}

func TestNew_TokenConfig(t *testing.T) {
	t.Parallel()
	_, err := limiter.New(redistest.Client(t), &limiter.Config{TokenMinute: time.Millisecond})
	require.ErrorContains(t, err, "TokenMinute")
}

// The grants hash keeps at most the most recent grantsKept (4,096) records, however long the
// credential stays busy. A grant that got no answer is never reconciled (Reconcile's contract),
// and the ids of grants share one counter with the pushes that learning from a response makes:
// a record whose id plus 4,096 was a push's was never dropped, so on a busy credential (its keys
// never idle long enough to expire) such records piled up for good. Here every response pushes
// the learned schedule, and of each two grants the second never gets an answer.
func TestCredential_UnreconciledGrantsStayBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, noHorizon)
	const id = "sk-grants-bound"
	c := b.lim.Gate(id, "main")
	requests := limiter.Limit{Rate: 1000, Burst: 1000000} // tokens learned, not configured
	// The provider reports its input bucket empty: learning pushes the schedule to the refill.
	empty := limiter.Observation{StatusCode: 200, InputTokens: limiter.TokenObservation{Known: true, Limit: 6000, Remaining: 0}}
	require.NoError(t, c.Observe(t.Context(), empty))
	const rounds = 4200 // beyond grantsKept (4,096)
	for range rounds {
		b.clock.Advance(61 * time.Second) // the bucket is full again
		answered, err := c.ReserveCost(t.Context(), requests, in(1))
		require.NoError(t, err)
		require.Positive(t, answered.Grant)
		lost, err := c.ReserveCost(t.Context(), requests, in(1))
		require.NoError(t, err)
		require.Positive(t, lost.Grant)
		require.NoError(t, c.Reconcile(t.Context(), answered.Grant, in(1)))
		require.NoError(t, c.Observe(t.Context(), empty))
	}
	rdb := redistest.Client(t)
	keys, err := rdb.Keys(t.Context(), b.prefix+"*:tkg").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	n, err := rdb.HLen(t.Context(), keys[0]).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, n, int64(4096), "grant records kept")
}
