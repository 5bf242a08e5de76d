package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

// A reservation whose reply is lost after Redis ran it (the connection cut: a failover, a proxy
// restart, CLIENT KILL) is sent again by go-redis on a new connection. A probe the first run
// granted is the retry's: it is not left out, unobserved, holding every other caller of the
// credential back for ProbeTTL. (A slot granted twice is left so: it wastes one of the provider's,
// rarely, where keeping every reply would write a key for every job; see reserveScript.)
func TestReserve_LostReplyKeepsTheProbe(t *testing.T) {
	t.Parallel()
	r := newCutRig(t)
	first := r.reserveCut(t)
	require.True(t, first.Granted, "the retry got the probe the first run took")
	require.True(t, first.Probe)

	second := r.reserve(t)
	require.False(t, second.Granted, "the probe is out: the others wait for its answer")
}

// While the rate is unknown, the limiter lends what the provider said remains; the last slot
// lent holds every other caller back for ProbeTTL, as a probe does, until an answer says more
// remains. That slot granted to a call whose reply was lost is the retry's, as a probe is.
func TestReserve_LostReplyKeepsTheLastLentSlot(t *testing.T) {
	t.Parallel()
	r := newCutRig(t)
	// A response gave the limit and one request remaining, but no reset time: the rate is not
	// known yet, and one request can be lent.
	require.NoError(t, r.gate.Observe(r.ctx, limiter.Observation{At: r.clock.Now(), StatusCode: 200,
		HeadersKnown: true, Limit: 10, Remaining: 1}))
	first := r.reserveCut(t)
	require.True(t, first.Granted, "the retry got the slot the first run lent")
	require.Equal(t, limiter.SourceLearned, first.Source)

	second := r.reserve(t)
	require.False(t, second.Granted, "the slot lent is out: the others wait for its answer")
}

// cutRig is a limiter on a client whose connection can lose a reply (redistest.CutClient), and
// the gate of credential "sk-cut" on it, asking with no limit known (the probe's case).
type cutRig struct {
	ctx    context.Context
	prefix string
	clock  *clocktest.Clock
	lim    *limiter.Limiter
	gate   *limiter.Gate
	cut    *redistest.Cutter
}

func newCutRig(t *testing.T) *cutRig {
	t.Helper()
	r := &cutRig{prefix: redistest.Prefix(t), clock: clocktest.New(t0)}
	rdb, cut := redistest.CutClient(t)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: r.prefix, Now: r.clock.Now})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	r.ctx, r.lim, r.gate, r.cut = ctx, lim, lim.Gate("sk-cut", "main"), cut
	return r
}

// reserve asks the gate for a slot.
func (r *cutRig) reserve(t *testing.T) limiter.Reservation {
	t.Helper()
	res, err := r.gate.ReserveAttempt(r.ctx, limiter.Limit{}, tokens.Cost{}, limiter.AttemptOptions{})
	require.NoError(t, err)
	return res
}

// reserveCut asks as reserve does, the reply of its first run lost (go-redis sends it again).
func (r *cutRig) reserveCut(t *testing.T) limiter.Reservation {
	t.Helper()
	// Redis caches the script first (an EVALSHA that finds it missing runs nothing).
	_, err := r.lim.Gate("sk-warm", "main").ReserveAttempt(r.ctx, limiter.Limit{}, tokens.Cost{}, limiter.AttemptOptions{})
	require.NoError(t, err)
	r.cut.Arm(r.prefix + redisscript.CredentialTag("sk-cut") + ":rl")
	res := r.reserve(t)
	require.Equal(t, 1, r.cut.Cuts(), "the reservation's reply was lost")
	return res
}

// A burst slot's send report (Gate.Sent) whose reply is lost is sent again by go-redis. Counted
// twice, it would end the burst a slot early: the schedule after it would count the provider's
// refill from the second-to-last send, and a slot after the burst would go while one of the
// burst's requests had not left yet. The report is counted once.
func TestSent_LostReplyCountsOnce(t *testing.T) {
	t.Parallel()
	r := newCutRig(t)
	opts := limiter.AttemptOptions{ReportSend: true}
	var burst []limiter.Reservation
	for i := range 20 {
		res, err := r.gate.ReserveAttempt(r.ctx, fairLimit, tokens.Cost{}, opts)
		require.NoError(t, err)
		require.True(t, res.Granted, "burst slot %d", i)
		require.NotZero(t, res.ReportSend)
		burst = append(burst, res)
	}
	// Redis caches the script first (an EVALSHA that finds it missing runs nothing).
	_, err := r.lim.Gate("sk-warm", "main").Sent(r.ctx, 1)
	require.NoError(t, err)

	r.clock.Advance(50 * time.Millisecond)
	r.cut.Arm(r.prefix + redisscript.CredentialTag("sk-cut") + ":rl")
	moved, err := r.gate.Sent(r.ctx, burst[0].ReportSend)
	require.NoError(t, err)
	require.Equal(t, 1, r.cut.Cuts(), "the report's reply was lost")
	require.Zero(t, moved, "the schedule waits for the whole burst")

	r.clock.Advance(250 * time.Millisecond)
	for _, res := range burst[1:19] {
		_, err := r.gate.Sent(r.ctx, res.ReportSend)
		require.NoError(t, err)
	}
	res, err := r.gate.ReserveAttempt(r.ctx, fairLimit, tokens.Cost{}, opts)
	require.NoError(t, err)
	require.False(t, res.Granted, "one of the burst has not left: no refill slot yet")

	r.clock.Advance(300 * time.Millisecond)
	moved, err = r.gate.Sent(r.ctx, burst[19].ReportSend)
	require.NoError(t, err)
	require.Positive(t, moved, "the burst's last report moves the schedule to its sends")
}

// A 429's observation whose reply is lost is sent again by go-redis. Its cut of the learned rate
// (10%, once per overload) is made once, not again by the retry: the retry runs after the cut,
// and on Redis's clock (the worker's) it runs later than its request was answered, so it reads as
// a request sent after the cut. Here the request's send time is unknown (taken as when answered),
// which on the test's clock is where the retry stands too.
func TestObserve_LostReplyCutsTheRateOnce(t *testing.T) {
	t.Parallel()
	r := newCutRig(t)
	r.clock.Advance(300 * time.Millisecond)
	now := r.clock.Now()
	require.NoError(t, r.gate.Observe(r.ctx, limiter.Observation{At: now, StatusCode: 200,
		HeadersKnown: true, Limit: 20, Remaining: 15, ResetAt: now.Add(2 * time.Second)}))
	rate := func() float64 {
		t.Helper()
		lim, src, err := r.gate.Current(r.ctx)
		require.NoError(t, err)
		require.Equal(t, limiter.SourceLearned, src)
		return lim.Rate
	}
	learned := rate()
	require.Positive(t, learned)

	r.clock.Advance(50 * time.Millisecond)
	r.cut.Arm(r.prefix + redisscript.CredentialTag("sk-cut") + ":rl")
	require.NoError(t, r.gate.Observe(r.ctx, limiter.Observation{At: r.clock.Now(), StatusCode: 429,
		RetryAfter: time.Second, HasRetryAfter: true}))
	require.Equal(t, 1, r.cut.Cuts(), "the observation's reply was lost")
	require.InDelta(t, learned*0.9, rate(), 1e-9, "one 429, one cut")
}
