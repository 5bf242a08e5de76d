package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

// The fairness tests drive the shared schedule with the injected clock: each simulated attempt
// asks (ReserveAttempt with its Lane) when it arrives and again exactly when it is told to, as a
// worker does, over two limiters (two processes). They assert who is granted which send time; no
// test sleeps.

// noCost reserves no tokens.
var noCost tokens.Cost

// sortTimes sorts ts in place and returns it.
func sortTimes(ts []time.Time) []time.Time {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// fairLimit is the benchmark's credential: 10 requests/s, burst 20.
var fairLimit = limiter.Limit{Rate: 10, Burst: 20}

// simAttempt is one waiting attempt.
type simAttempt struct {
	lane    limiter.Lane
	arrive  time.Time
	next    time.Time // when it asks (again)
	granted bool
	send    time.Time // its slot, once granted
	asks    int
}

// fairSim runs attempts against one credential.
type fairSim struct {
	t     *testing.T
	b     *testBundle
	gates []*limiter.Gate
	all   []*simAttempt
	seq   int
	asked []time.Time // when each ask was made
	// limit is the credential's (fairLimit when zero); costs are each tenant's attempts' tokens
	// (none when absent).
	limit limiter.Limit
	costs map[string]tokens.Cost
	// onGrant, when set, is called with each attempt as it is granted (a client that submits its
	// next job when one is granted adds it here).
	onGrant func(a *simAttempt)
}

func newFairSim(t *testing.T, mod func(*limiter.Config)) *fairSim {
	b := setup(t, mod)
	id := "fair-" + redistest.Rand()
	return &fairSim{t: t, b: b, gates: []*limiter.Gate{b.lim.Gate(id, "main"), b.lim2.Gate(id, "main")}}
}

// add makes n attempts of tenant (weight w) at priority p that arrive at t0+at, created in that
// order.
func (s *fairSim) add(tenant string, w int, p limiter.Priority, n int, at time.Duration) []*simAttempt {
	out := make([]*simAttempt, n)
	for i := range out {
		s.seq++
		arrive := t0.Add(at)
		out[i] = &simAttempt{arrive: arrive, next: arrive, lane: limiter.Lane{Tenant: tenant, Weight: w, Priority: p,
			Ticket: fmt.Sprintf("%s-%d-%06d", tenant, p, s.seq), Since: arrive.Add(time.Duration(s.seq) * time.Microsecond)}}
	}
	s.all = append(s.all, out...)
	return out
}

// run lets every attempt due by the clock ask, in arrival order, and moves the clock to the next
// ask, until the clock passes until or every attempt is granted.
func (s *fairSim) run(until time.Time) {
	s.t.Helper()
	ctx := context.Background()
	for {
		now := s.b.clock.Now()
		var next time.Time
		for i, a := range s.all {
			if a.granted {
				continue
			}
			if !a.next.After(now) {
				a.asks++
				s.asked = append(s.asked, now)
				lim := s.limit
				if lim.Rate == 0 {
					lim = fairLimit
				}
				r, err := s.gates[i%2].ReserveAttempt(ctx, lim, s.costs[a.lane.Tenant], limiter.AttemptOptions{Lane: &a.lane})
				require.NoError(s.t, err)
				if r.Granted {
					a.granted, a.send = true, r.SendAt
					if s.onGrant != nil {
						s.onGrant(a)
					}
					continue
				}
				require.True(s.t, r.SendAt.After(now), "told to ask again at %v, now %v", r.SendAt, now)
				a.next = r.SendAt
			}
			if next.IsZero() || a.next.Before(next) {
				next = a.next
			}
		}
		if next.IsZero() || next.After(until) {
			s.b.clock.Set(until)
			return
		}
		s.b.clock.Set(next)
	}
}

// sends counts the granted sends in [from, to) by tenant and priority ("A" counts all of A's,
// "A/2" its low ones).
func (s *fairSim) sends(from, to time.Time) map[string]int {
	n := map[string]int{}
	for _, a := range s.all {
		if a.granted && !a.send.Before(from) && a.send.Before(to) {
			n[a.lane.Tenant]++
			n[fmt.Sprintf("%s/%d", a.lane.Tenant, a.lane.Priority)]++
			n[""]++
		}
	}
	return n
}

// TestFair_EqualTenantsShareEqually is behaviour 2: A and B each submit 2,000 normal jobs at once;
// in every 10 s window while both have work, each gets 50% ± 5% of the sends. (A's first asks
// find the bucket full and nobody else waiting: those 20 go at once, before B exists.)
func TestFair_EqualTenantsShareEqually(t *testing.T) {
	t.Parallel()
	requireShares(t, 1, 0.5)
}

// TestFair_WeightsTwoToOne is behaviour 2 with weights 2 and 1: 67% / 33% ± 5% per 10 s window.
func TestFair_WeightsTwoToOne(t *testing.T) {
	t.Parallel()
	requireShares(t, 2, 2.0/3)
}

// requireShares runs 2,000 normal jobs of A (weight wA) and then of B (weight 1), submitted at
// once, and requires A's share of the sends to be want ± 0.05 in each of six 10 s windows, with
// the credential's rate used in full.
func requireShares(t *testing.T, wA int, want float64) {
	s := newFairSim(t, nil)
	s.add("A", wA, limiter.PriorityNormal, 2000, 0)
	s.add("B", 1, limiter.PriorityNormal, 2000, time.Millisecond)
	s.run(t0.Add(61 * time.Second))
	for w := range 6 {
		from := t0.Add(time.Second + time.Duration(w)*10*time.Second)
		n := s.sends(from, from.Add(10*time.Second))
		share := float64(n["A"]) / float64(n[""])
		t.Logf("window %d: A %d, B %d (A %.3f)", w, n["A"], n["B"], share)
		require.InDelta(t, want, share, 0.05, "window %d", w)
		require.GreaterOrEqual(t, n[""], 97, "window %d: the credential's rate is used", w)
	}
}

// TestFair_TokensShareLikeRequests: on a credential whose input tokens bind (10 requests/s, but
// 60,000 input tokens a minute: 1,000 a second), A's prompts are ten times B's. Both have work
// waiting: each gets half of the input tokens (± 5%) in every 20 s window, not half of the
// requests (which would give A ten elevenths of the tokens). A grant moves its lane on by the
// request's dominant share: A's 1,000 tokens take a second of the token bucket, ten request
// slots. (The windows are 20 s, not 10: A's requests come about six to a 10 s window, and one
// more or less is 8% of its tokens.)
func TestFair_TokensShareLikeRequests(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.limit = limiter.Limit{Rate: 10, Burst: 20, InputTokensPerMinute: 60000}
	s.costs = map[string]tokens.Cost{"A": {InputTokens: 1000}, "B": {InputTokens: 100}}
	s.add("A", 1, limiter.PriorityNormal, 200, 0)
	s.add("B", 1, limiter.PriorityNormal, 2000, time.Millisecond)
	s.run(t0.Add(121 * time.Second))
	for w := range 6 {
		from := t0.Add(time.Second + time.Duration(w)*20*time.Second)
		n := s.sends(from, from.Add(20*time.Second))
		a, b := 1000*n["A"], 100*n["B"]
		share := float64(a) / float64(a+b)
		t.Logf("window %d: A %d (%d tokens), B %d (%d tokens): A's token share %.3f", w, n["A"], a, n["B"], b, share)
		require.InDelta(t, 0.5, share, 0.05, "window %d", w)
	}
}

// TestFair_InteractiveUnderFlood is behaviour 1 (and 5 on the schedule): A has 3,000 low jobs
// waiting; B submits one normal job a second for 60 s. Each of B's jobs gets a send time within
// 0.5 s of its arrival, and A's jobs take every other slot: the credential's rate is used in
// full.
func TestFair_InteractiveUnderFlood(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.add("A", 1, limiter.PriorityLow, 3000, 0)
	var bs []*simAttempt
	for i := range 60 {
		bs = append(bs, s.add("B", 1, limiter.PriorityNormal, 1, 5*time.Second+time.Duration(i)*time.Second+
			time.Duration(i*37%100)*time.Millisecond)...)
	}
	s.run(t0.Add(70 * time.Second))
	var worst time.Duration
	var waits []time.Duration
	for i, b := range bs {
		require.True(t, b.granted, "B's job %d", i)
		worst = max(worst, b.send.Sub(b.arrive))
		waits = append(waits, b.send.Sub(b.arrive))
	}
	slices.Sort(waits)
	t.Logf("B's waits from arrival to send time: %v", waits)
	require.LessOrEqual(t, worst, 500*time.Millisecond)
	n := s.sends(t0.Add(5*time.Second), t0.Add(65*time.Second))
	t.Logf("5s..65s: %d sends (A %d, B %d)", n[""], n["A"], n["B"])
	require.Equal(t, 60, n["B"])
	// 60 s at 10/s spaced 1% apart: 594 slots; nothing is left unused.
	require.GreaterOrEqual(t, n[""], 592)
}

// TestFair_HighGoesFirstInsideATenant is behaviour 3: A has 2,000 low jobs waiting and submits 20
// high: the 20 go before A's waiting low work, but for its minimum share (5%: one slot).
func TestFair_HighGoesFirstInsideATenant(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.add("A", 1, limiter.PriorityLow, 2000, 0)
	at := 10 * time.Second
	high := s.add("A", 1, limiter.PriorityHigh, 20, at)
	s.run(t0.Add(20 * time.Second))
	var last time.Time
	for i, h := range high {
		require.True(t, h.granted, "high %d", i)
		if h.send.After(last) {
			last = h.send
		}
	}
	arrive := t0.Add(at)
	lows := s.sends(arrive, last)["A/2"]
	t.Logf("the 20 high jobs were sent within %v of arriving; %d low jobs in between", last.Sub(arrive), lows)
	// 20 slots at 10/s take 2 s, plus the horizon's slots handed out before they came.
	require.LessOrEqual(t, last.Sub(arrive), 2500*time.Millisecond)
	require.LessOrEqual(t, lows, 4, "low work goes in between only for its minimum share and the horizon")
}

// TestFair_LowKeepsItsMinimumShare is behaviour 4: with high work saturating the credential, low
// work of the same tenant still gets its minimum share (5% by default) in every minute.
func TestFair_LowKeepsItsMinimumShare(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.add("A", 1, limiter.PriorityLow, 500, 0)
	s.add("A", 1, limiter.PriorityHigh, 2000, time.Millisecond)
	s.run(t0.Add(122 * time.Second))
	for w := range 2 {
		from := t0.Add(2*time.Second + time.Duration(w)*time.Minute)
		n := s.sends(from, from.Add(time.Minute))
		share := float64(n["A/2"]) / float64(n[""])
		t.Logf("minute %d: high %d, low %d (low %.3f)", w, n["A/0"], n["A/2"], share)
		require.GreaterOrEqual(t, share, 0.045, "minute %d", w)
		require.LessOrEqual(t, share, 0.06, "minute %d: low takes no more than its share", w)
	}
}

// TestFair_FlushLosesNothing is behaviour 7 on the schedule: Redis loses the fairness state (and
// the rest of the credential's state) mid-run; every waiting attempt is still granted exactly
// once, its ticket put back in its place when it asks again, and the tenants share equally again
// within 3 s. (The request bucket is lost too: its 20 requests go to whoever asks first, as they
// would without fairness.)
func TestFair_FlushLosesNothing(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.add("A", 1, limiter.PriorityNormal, 150, 0)
	s.add("B", 1, limiter.PriorityNormal, 150, time.Millisecond)
	s.run(t0.Add(10 * time.Second))
	before := s.sends(t0, t0.Add(10*time.Second))[""]

	rdb := redistest.Client(t)
	keys, err := rdb.Keys(context.Background(), s.b.prefix+"*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	require.NoError(t, rdb.Del(context.Background(), keys...).Err())

	s.run(t0.Add(60 * time.Second))
	seen := map[string]bool{}
	for _, a := range s.all {
		require.True(t, a.granted, "%s was never granted", a.lane.Ticket)
		require.False(t, seen[a.lane.Ticket])
		seen[a.lane.Ticket] = true
	}
	n := s.sends(t0.Add(13*time.Second), t0.Add(21*time.Second))
	t.Logf("%d sends before the flush; from 3 s to 11 s after it: A %d, B %d", before, n["A"], n["B"])
	require.InDelta(t, 0.5, float64(n["A"])/float64(n[""]), 0.05, "the tenants still alternate after the flush")
}

// TestFair_HerdStillAtTheFloor: a lane changes nothing for one tenant's herd. 100 jobs against a
// bucket of 20 refilled at 10/s get 100 slots (no more asks granted than jobs) within the bucket,
// the last at the floor plus the margins (8.18 s; the floor is 8.0 s).
func TestFair_HerdStillAtTheFloor(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.add("A", 1, limiter.PriorityNormal, 100, 0)
	s.run(t0.Add(30 * time.Second))
	var sends []time.Time
	asks := 0
	for _, a := range s.all {
		require.True(t, a.granted)
		sends = append(sends, a.send)
		asks += a.asks
	}
	last := sends[0]
	for _, x := range sends {
		if x.After(last) {
			last = x
		}
	}
	t.Logf("last send %v after the first ask; %d asks for 100 slots", last.Sub(t0), asks)
	require.LessOrEqual(t, last.Sub(t0), 8200*time.Millisecond)
	require.LessOrEqual(t, last.Sub(t0).Seconds(), 8.0*1.05)
	requireWithinBucket(t, sortTimes(sends), 20, 10)
}

// TestFair_Validation: a bad Lane reserves nothing and says what is wrong; a bad Fairness config
// names its field.
func TestFair_Validation(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	g := b.lim.Gate("fair-"+redistest.Rand(), "main")
	for _, tc := range []struct {
		lane limiter.Lane
		want string
	}{
		{limiter.Lane{Ticket: "j"}, "lane tenant"},
		{limiter.Lane{Tenant: "a|b", Ticket: "j"}, "lane tenant"},
		{limiter.Lane{Tenant: "a", Weight: 1001, Ticket: "j"}, "lane weight"},
		{limiter.Lane{Tenant: "a", Priority: 3, Ticket: "j"}, "lane priority"},
		{limiter.Lane{Tenant: "a"}, "lane ticket"},
	} {
		_, err := g.ReserveAttempt(context.Background(), fairLimit, noCost, limiter.AttemptOptions{Lane: &tc.lane})
		require.ErrorContains(t, err, tc.want)
	}
	for _, tc := range []struct {
		f    limiter.Fairness
		want string
	}{
		{limiter.Fairness{MinShareLow: 0.6}, "Fairness.MinShareLow"},
		{limiter.Fairness{MinShareNormal: -1}, "Fairness.MinShareNormal"},
		{limiter.Fairness{MinShareNormal: 0.5, MinShareLow: 0.5}, "at most 0.9"},
		{limiter.Fairness{Horizon: time.Minute}, "Fairness.MaxRecheck"},
	} {
		_, err := limiter.New(redistest.Client(t), &limiter.Config{Fairness: tc.f})
		require.ErrorContains(t, err, tc.want)
	}
}

// TestFair_BacklogAsksSpread is behaviour 6 on the schedule: a backlog's waiting jobs ask again
// at about half their foreseen wait once it is beyond MaxRecheck (30 s), spread by their place in
// line; they do not all come back together every 30 s (3,000 jobs asking within one second, each
// a deferral through the queue that an interactive job then waits behind). The credential's
// rate is still used in full.
func TestFair_BacklogAsksSpread(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.add("A", 1, limiter.PriorityLow, 3000, 0)
	s.run(t0.Add(100 * time.Second))
	perSecond := map[int64]int{}
	for _, at := range s.asked {
		if at.After(t0.Add(time.Second)) {
			perSecond[at.Sub(t0).Milliseconds()/1000]++
		}
	}
	worst := 0
	for _, n := range perSecond {
		worst = max(worst, n)
	}
	n := s.sends(t0, t0.Add(100*time.Second))
	t.Logf("%d asks after the first second (at most %d in one second); %d sends in 100 s", len(s.asked)-3000, worst, n[""])
	require.LessOrEqual(t, worst, 100, "asks in any one second after the first")
	require.GreaterOrEqual(t, n[""], 20+980, "20 at once, then 10/s spaced 1% apart")
}

// TestFair_LoneLaneSkipsTheQueue: while no lane waits, a granted ask leaves no fairness state
// behind (it costs Redis no more than an ask without a lane), and an ask refused after all, here
// because the burst has not reported its sends (ReportSend), still takes its place in its lane.
func TestFair_LoneLaneSkipsTheQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	g := b.lim.Gate("fair-"+redistest.Rand(), "main")
	ask := func(i int) limiter.Reservation {
		t.Helper()
		r, err := g.ReserveAttempt(ctx, fairLimit, noCost, limiter.AttemptOptions{ReportSend: true, Lane: &limiter.Lane{
			Tenant: "A", Priority: limiter.PriorityNormal, Ticket: fmt.Sprintf("j%02d", i), Since: t0.Add(time.Duration(i))}})
		require.NoError(t, err)
		return r
	}
	rdb := redistest.Client(t)
	fairKeys := func() []string {
		t.Helper()
		keys, err := rdb.Keys(ctx, b.prefix+"*").Result()
		require.NoError(t, err)
		return slices.DeleteFunc(keys, func(k string) bool { return !strings.Contains(k, ":fq") })
	}

	for i := range fairLimit.Burst {
		require.True(t, ask(i).Granted, "burst slot %d", i)
	}
	require.Empty(t, fairKeys(), "a lone lane's granted asks")

	// the first refill slot (at 100 ms, sent after the phase margin: 200 ms) is within the horizon
	// (50 ms), but the burst has not reported its sends
	b.clock.Set(t0.Add(160 * time.Millisecond))
	require.False(t, ask(20).Granted, "a refill slot before the burst's sends are reported")
	var lane string
	for _, k := range fairKeys() {
		if strings.HasSuffix(k, ":fq:A|1") {
			lane = k
		}
	}
	require.NotEmpty(t, lane, "the refused ask's lane, among %v", fairKeys())
	tickets, err := rdb.ZRange(ctx, lane, 0, -1).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"j20"}, tickets)
}

// A lane whose turn is far off (more than twice MaxRecheck on a slow credential) keeps its place
// while its holder waits to ask again: its one ticket was dropped meanwhile, the lane found empty
// and removed, and on its return it started again at the other lanes' virtual time, a full
// share later every time, so that its wait never shrank.
func TestFair_AFarTurnKeepsItsPlace(t *testing.T) {
	t.Parallel()
	t.Run("LightTenantsLoneJob", func(t *testing.T) {
		t.Parallel()
		// A (weight 1) has one job; B (weight 1000) a backlog of 2,000 at 10/s: A's turn is about
		// 1,000 of B's slots (100 s) out, well before B's backlog is done (200 s).
		s := newFairSim(t, nil)
		s.add("B", 1000, limiter.PriorityNormal, 2000, 0)
		a := s.add("A", 1, limiter.PriorityNormal, 1, time.Millisecond)[0]
		s.run(t0.Add(150 * time.Second))
		require.True(t, a.granted, "A's job starved by B's backlog (asked %d times)", a.asks)
	})
	t.Run("LowMinimumShareOnASlowCredential", func(t *testing.T) {
		t.Parallel()
		// A's one low job beside its normal backlog at 12 requests a minute: its minimum share (5%)
		// puts its turn about 19 slots (95 s) out.
		s := newFairSim(t, nil)
		s.limit = limiter.Limit{Rate: 0.2, Burst: 1}
		s.add("A", 1, limiter.PriorityNormal, 100, 0)
		low := s.add("A", 1, limiter.PriorityLow, 1, time.Millisecond)[0]
		s.run(t0.Add(200 * time.Second))
		require.True(t, low.granted && low.send.Before(t0.Add(110*time.Second)),
			"the low job held back past its minimum share's turn (granted %v, send %v)", low.granted, low.send.Sub(t0))
	})
}

// The fairness hash keeps the weight of a tenant only while one of its lanes waits: every tenant
// that ever waited on a busy credential left its weight there for good (the hash's expiry is
// pushed on by every ask), a field per tenant without bound. Here 100 tenants with a job each wait
// behind A's backlog; once every job is granted, no lane waits and no weight is left.
func TestFair_WeightsLeaveWithTheirLanes(t *testing.T) {
	t.Parallel()
	s := newFairSim(t, nil)
	s.add("A", 1, limiter.PriorityNormal, 200, 0)
	for i := range 100 {
		s.add(fmt.Sprintf("t%03d", i), 2, limiter.PriorityNormal, 1, time.Second+time.Duration(i)*100*time.Millisecond)
	}
	s.run(t0.Add(60 * time.Second))
	for _, a := range s.all {
		require.True(t, a.granted, "%s was never granted", a.lane.Ticket)
	}
	rdb := redistest.Client(t)
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, s.b.prefix+"*:fq").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	fields, err := rdb.HKeys(ctx, keys[0]).Result()
	require.NoError(t, err)
	var weights []string
	for _, f := range fields {
		if strings.HasPrefix(f, "w|") {
			weights = append(weights, f)
		}
	}
	require.Empty(t, weights, "weights of tenants with no lane waiting")
}
