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
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
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
