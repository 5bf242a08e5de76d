package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

// providerAccepts replays arrivals against a provider's bucket of burst requests refilled at
// rate per second, full before the first (the simulator's GCRA), and returns the arrivals it
// refuses.
func providerAccepts(arrivals []time.Time, burst int, rate float64) []time.Time {
	arrivals = slices.Clone(arrivals)
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	interval := time.Duration(float64(time.Second) / rate)
	window := time.Duration(burst) * interval
	var fullAt time.Time
	var refused []time.Time
	for _, at := range arrivals {
		debt := max(fullAt.Sub(at), 0)
		if debt+interval > window {
			refused = append(refused, at)
			continue
		}
		fullAt = at.Add(debt + interval)
	}
	return refused
}

// TestReportSend_RefillCountsFromTheBurstsSend: a burst granted from a full bucket whose requests
// leave late (a worker's bookkeeping before the send, under load): one 50 ms after its grant, the
// other 19 after 300 ms. Counted from the grants, the first slot after the burst would go at
// 0.2 s, before the burst reached the provider, whose bucket was full (not refilling) until then:
// a 429. With the sends reported, the slots after the burst wait for the last report and count
// from the sends: the provider accepts every request. With or without a Lane.
func TestReportSend_RefillCountsFromTheBurstsSend(t *testing.T) {
	t.Parallel()
	for _, withLane := range []bool{false, true} {
		t.Run(fmt.Sprintf("lane=%v", withLane), func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			b := setup(t, nil)
			g := b.lim.Gate("anchor-"+redistest.Rand(), "main")
			n := 0
			ask := func() limiter.Reservation {
				opts := limiter.AttemptOptions{ReportSend: true}
				if withLane {
					opts.Lane = &limiter.Lane{Tenant: "A", Priority: limiter.PriorityLow, Ticket: fmt.Sprintf("job-%03d", n),
						Since: t0.Add(time.Duration(n) * time.Microsecond)}
				}
				r, err := g.ReserveAttempt(ctx, fairLimit, noCost, opts)
				require.NoError(t, err)
				if r.Granted {
					n++
				}
				return r
			}
			var burst []limiter.Reservation
			for i := range 20 {
				r := ask()
				require.True(t, r.Granted, "burst slot %d", i)
				require.Zero(t, r.Wait)
				require.NotZero(t, r.ReportSend, "a burst slot reports its send")
				burst = append(burst, r)
			}
			r := ask()
			require.False(t, r.Granted, "no refill slot before the burst has left")
			if !withLane { // a lane's ask is told to come back at its turn (later) first
				require.Equal(t, limiter.DefaultPollInterval, r.Wait)
			}

			var arrivals []time.Time
			send := func(r limiter.Reservation) time.Duration {
				moved, err := g.Sent(ctx, r.ReportSend)
				require.NoError(t, err)
				arrivals = append(arrivals, b.clock.Now())
				return moved
			}
			b.clock.Advance(50 * time.Millisecond)
			require.Zero(t, send(burst[0]), "the schedule waits for the whole burst")
			b.clock.Advance(250 * time.Millisecond)
			r = ask()
			require.False(t, r.Granted, "19 of the burst have not left")
			for _, r := range burst[1:] {
				send(r)
			}
			for i := range 30 {
				r := ask()
				for k := 0; !r.Granted; k++ { // a lane's ask comes back when told to
					require.Less(t, k, 10, "slot %d after the burst never granted", i)
					require.Positive(t, r.Wait)
					b.clock.Set(r.SendAt)
					r = ask()
				}
				require.Zero(t, r.ReportSend, "a refill slot reports nothing")
				arrivals = append(arrivals, r.SendAt)
				b.clock.Set(r.SendAt)
			}
			require.Empty(t, providerAccepts(arrivals, 20, 10), "the provider refuses none")
			again, err := g.Sent(ctx, burst[0].ReportSend)
			require.NoError(t, err)
			require.Zero(t, again, "a report too many changes nothing")
		})
	}
}

// TestReportSend_CarriedOver: a burst slot not yet reported when the bucket is full again (its
// worker slow for 0.5 s) still leaves in the next burst: that burst holds one slot fewer, and its
// report counts there.
func TestReportSend_CarriedOver(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := setup(t, nil)
	g := b.lim.Gate("anchor-"+redistest.Rand(), "main")
	opts := limiter.AttemptOptions{ReportSend: true}
	late, err := g.ReserveAttempt(ctx, fairLimit, noCost, opts)
	require.NoError(t, err)
	require.True(t, late.Granted)
	b.clock.Advance(500 * time.Millisecond)
	var burst []limiter.Reservation
	for {
		r, err := g.ReserveAttempt(ctx, fairLimit, noCost, opts)
		require.NoError(t, err)
		if !r.Granted {
			break
		}
		require.Less(t, len(burst), 20)
		require.NotZero(t, r.ReportSend)
		burst = append(burst, r)
	}
	require.Len(t, burst, 19, "the late slot takes the next burst's room")
	arrivals := []time.Time{b.clock.Now()}
	_, err = g.Sent(ctx, late.ReportSend)
	require.NoError(t, err)
	for _, r := range burst {
		_, err := g.Sent(ctx, r.ReportSend)
		require.NoError(t, err)
		arrivals = append(arrivals, b.clock.Now())
	}
	for range 10 {
		r, err := g.ReserveAttempt(ctx, fairLimit, noCost, opts)
		require.NoError(t, err)
		require.True(t, r.Granted)
		arrivals = append(arrivals, r.SendAt)
		b.clock.Set(r.SendAt)
	}
	require.Empty(t, providerAccepts(arrivals, 20, 10), "the provider refuses none")
}

// TestReportSend_NoReportWaitsASecond: a burst whose sends are never reported (its workers died)
// holds the refill slots back one second after its last grant, taken as when it left; a plain Reserve, which
// promises no report, is not marked and does not wait.
func TestReportSend_NoReportWaitsASecond(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := setup(t, nil)
	g := b.lim.Gate("anchor-"+redistest.Rand(), "main")
	opts := limiter.AttemptOptions{ReportSend: true}
	for range 20 {
		r, err := g.ReserveAttempt(ctx, fairLimit, noCost, opts)
		require.NoError(t, err)
		require.True(t, r.Granted)
	}
	b.clock.Advance(999 * time.Millisecond)
	r, err := g.ReserveAttempt(ctx, fairLimit, noCost, opts)
	require.NoError(t, err)
	require.False(t, r.Granted)
	require.Equal(t, time.Millisecond, r.Wait, "asked back when the report is given up")
	b.clock.Advance(time.Millisecond)
	r, err = g.ReserveAttempt(ctx, fairLimit, noCost, opts)
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.False(t, r.SendAt.Before(t0.Add(time.Second+100*time.Millisecond)), "counted from a send at 1 s: %v", r.SendAt.Sub(t0))

	plain := b.lim.Gate("plain-"+redistest.Rand(), "main")
	for range 20 {
		r, err := plain.Reserve(ctx, fairLimit)
		require.NoError(t, err)
		require.Zero(t, r.ReportSend)
	}
	r, err = plain.Reserve(ctx, fairLimit)
	require.NoError(t, err)
	require.True(t, r.Granted, "without ReportSend the refill slot is granted at once, as before")
}

// tokenAnchor is the token-bound anchoring tests' credential: requests of 100 input tokens on a
// bucket of 400 a second, whose request bucket (room for 100) never binds, asked with ReportSend
// on an injected clock.
type tokenAnchor struct {
	t    *testing.T
	ctx  context.Context
	b    *testBundle
	g    *limiter.Gate
	lim  limiter.Limit
	cost tokens.Cost
	opts limiter.AttemptOptions
}

func newTokenAnchor(t *testing.T) *tokenAnchor {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	b := setup(t, func(c *limiter.Config) { c.TokenMinute = time.Second })
	return &tokenAnchor{t: t, ctx: ctx, b: b, g: b.lim.Gate("anchor-"+redistest.Rand(), "main"),
		lim:  limiter.Limit{Rate: 100, Burst: 100, InputTokensPerMinute: 400},
		cost: tokens.Cost{InputTokens: 100}, opts: limiter.AttemptOptions{ReportSend: true}}
}

// reserve asks for a slot once.
func (a *tokenAnchor) reserve() limiter.Reservation {
	r, err := a.g.ReserveAttempt(a.ctx, a.lim, a.cost, a.opts)
	require.NoError(a.t, err)
	return r
}

// granted asks for slot i until it is granted, each time at the time it was told to ask again
// (the token horizon: after the poll interval).
func (a *tokenAnchor) granted(i int) limiter.Reservation {
	r := a.reserve()
	for k := 0; !r.Granted; k++ {
		require.Less(a.t, k, 200, "slot %d after the burst never granted", i)
		require.Positive(a.t, r.Wait)
		a.b.clock.Set(r.SendAt)
		r = a.reserve()
	}
	return r
}

// sent reports r's send now.
func (a *tokenAnchor) sent(r limiter.Reservation) {
	_, err := a.g.Sent(a.ctx, r.ReportSend)
	require.NoError(a.t, err)
}

// TestReportSend_TokenRefillCountsFromTheBurstsSend: the token buckets' schedule after a burst
// counts from the burst's sends too. 4 requests of 100 input tokens empty a bucket of 400 per
// second (the request bucket has room for 100): granted at once, they leave 150 ms later. The
// provider's token bucket stayed full until then, so a fifth request at the refill counted from
// the grants (0.25 s, plus the phase margin) would be refused. The token-bound slots wait for the
// burst's reports, and then count from them: the provider accepts every request.
func TestReportSend_TokenRefillCountsFromTheBurstsSend(t *testing.T) {
	t.Parallel()
	a := newTokenAnchor(t)
	var burst []limiter.Reservation
	for i := range 4 {
		r := a.reserve()
		require.True(t, r.Granted, "burst slot %d", i)
		require.Zero(t, r.Wait)
		require.NotZero(t, r.ReportSend)
		burst = append(burst, r)
	}
	require.False(t, a.reserve().Granted, "a slot the tokens push waits for the burst's sends")

	a.b.clock.Advance(150 * time.Millisecond)
	var arrivals []time.Time
	for _, r := range burst {
		a.sent(r)
		arrivals = append(arrivals, a.b.clock.Now())
	}
	for i := range 8 {
		r := a.granted(i)
		arrivals = append(arrivals, r.SendAt)
		a.b.clock.Set(r.SendAt)
	}
	// 100 tokens of a bucket of 400 refilled at 400/s: a request bucket of 4 refilled at 4/s
	require.Empty(t, providerAccepts(arrivals, 4, 4), "the provider refuses none")
	last := arrivals[len(arrivals)-1].Sub(t0)
	require.Less(t, last, 2600*time.Millisecond, "and the schedule is not held back beyond the burst's lateness")
}

// TestReportSend_TokenPushedSlotIsNoBurstSlot: a slot the request bucket holds at once but the
// token buckets push later is sent (and reported, as the worker reports every slot granted with
// ReportSend) at its send time, not at its grant. Counted as one of the request bucket's burst
// slots, it held every later token-bound ask until it left, and its own wait for the tokens was
// then taken for the burst's lateness and added to the token schedule: each slot after the burst
// pushed the next further (in the tokens bench, 0.4, 0.7 and 1.0 s). The schedule after the
// burst must keep the token bucket's pace: one request a refill interval after the other.
func TestReportSend_TokenPushedSlotIsNoBurstSlot(t *testing.T) {
	t.Parallel()
	a := newTokenAnchor(t)
	var arrivals []time.Time
	// send reports r's send at its send time, as the worker does, and records the arrival.
	send := func(r limiter.Reservation) {
		a.b.clock.Set(r.SendAt)
		if r.ReportSend != 0 {
			a.sent(r)
		}
		arrivals = append(arrivals, a.b.clock.Now())
	}
	for i := range 4 { // the token bucket's burst, sent at once
		r := a.reserve()
		require.True(t, r.Granted, "burst slot %d", i)
		send(r)
	}
	for i := range 8 {
		send(a.granted(i))
	}
	require.Empty(t, providerAccepts(arrivals, 4, 4), "the provider refuses none")
	// 8 slots at the refill's pace (0.25 s) after the burst, plus the phase margin and the rate
	// margin: 2.0 s and a little. Each slot's wait taken for lateness made it 4 s and more.
	last := arrivals[len(arrivals)-1].Sub(t0)
	require.Less(t, last, 2300*time.Millisecond, "the slots after the burst keep the token bucket's pace")
	for i := 5; i < len(arrivals); i++ {
		require.Less(t, arrivals[i].Sub(arrivals[i-1]), 300*time.Millisecond, "slot %d comes one refill interval after the one before", i)
	}
}

// TestReportSend_RefundAfterTheBurstsSend: a grant reconciled after its burst's send was
// reported still gives back what it over-reserved. The report moves the token schedule later (by
// the burst's lateness); it is a shift of the whole schedule, so the refund bounds move with it.
// Recorded instead as a new slot after the grant, it kept every burst slot's full reservation (an
// estimate's margin, max_tokens against the output bucket) for the whole token minute.
func TestReportSend_RefundAfterTheBurstsSend(t *testing.T) {
	t.Parallel()
	limit := limiter.Limit{Rate: 100, Burst: 100, InputTokensPerMinute: 1000}
	for _, report := range []bool{false, true} {
		b := setup(t, nil)
		ctx := t.Context()
		g := b.lim.Gate("refund-"+redistest.Rand(), "refund")
		r, err := g.ReserveAttempt(ctx, limit, tokens.Cost{InputTokens: 625}, limiter.AttemptOptions{ReportSend: true})
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.NotZero(t, r.ReportSend, "a full bucket's slot")
		b.clock.Advance(20 * time.Millisecond)
		if report {
			_, err = g.Sent(ctx, r.ReportSend)
			require.NoError(t, err)
		}
		b.clock.Advance(500 * time.Millisecond)
		require.NoError(t, g.Reconcile(ctx, r.Grant, tokens.Cost{InputTokens: 100})) // the provider counted 100
		next, err := g.ReserveCost(ctx, limit, tokens.Cost{InputTokens: 625})
		require.NoError(t, err)
		require.Less(t, next.Wait, time.Second, "send reported %v: 900 of the 1,000 tokens are free after the refund", report)
	}
}
