package limiter

import (
	"encoding"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redisscript"
)

// TestGate_ScriptArgsFormattedOnce: the scripts' arguments that the configuration alone decides
// are formatted and boxed once, in New, not at each call (issue 23): a lane's fairness arguments
// cost their slice, the lane's key and the lane's own values only, and every argument is the
// value, of the type, that formatting it at the call gave.
func TestGate_ScriptArgsFormattedOnce(t *testing.T) { // not parallel: testing.AllocsPerRun
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	t.Cleanup(func() { _ = rdb.Close() })
	cfg := &Config{Fairness: Fairness{MinShareNormal: 0.25, MinShareLow: 0.05}, RateMargin: 0.9}
	l, err := New(rdb, cfg)
	require.NoError(t, err)
	g := l.Gate("sk-main", "main")
	lane := &Lane{Tenant: "acme", Weight: 3, Priority: PriorityHigh, Ticket: "job-1", Since: time.UnixMicro(1_700_000_000_000_000)}

	c, f, b := &l.cfg, &l.cfg.Fairness, &l.cfg.Budget
	require.Equal(t, sent(t, []any{"1", fairLaneKey(c.Prefix, g.tag), lane.name(), "acme", int(PriorityHigh), 3,
		"job-1", int64(1_700_000_000_000_000), "0.25", "0.05", micros(f.Horizon), micros(f.TicketGrace),
		micros(f.MaxRecheck)}), sent(t, g.appendFairArgs(nil, new(redisscript.Args), lane)))
	require.Equal(t, scriptArgs{
		phaseMargin: micros(c.PhaseMargin), rateMargin: "0.9", learnTTL: micros(c.LearnTTL), probeTTL: micros(c.ProbeTTL),
		pollInterval: micros(c.PollInterval), learnHorizon: micros(c.LearnHorizon), tokenMinute: micros(c.TokenMinute),
		tokenHorizon: micros(c.TokenHorizon), budgetWindow: micros(b.Window), budgetBuckets: b.Buckets,
		budgetRatio: fmtFloat(b.Ratio), budgetFloor: b.Floor, minShareNormal: "0.25", minShareLow: "0.05",
		fairHorizon: micros(f.Horizon), ticketGrace: micros(f.TicketGrace), maxRecheck: micros(f.MaxRecheck),
		rateDecrease: "0.1",
	}, l.args)

	// The call's Args alone: the lane's name, the tenant, the ticket and the numbers are formatted
	// into it, and the caller's slice has room. (Making the lane's key and its name and boxing each,
	// the tenant, the ticket and the time, and the slice, made it 8; formatting the configuration's
	// too, 15.)
	buf := make([]any, 0, 13)
	allocs := testing.AllocsPerRun(100, func() { _ = g.appendFairArgs(buf[:0], new(redisscript.Args), lane) })
	require.LessOrEqual(t, allocs, 1.0, "allocations per appendFairArgs")
}

// TestGate_KeysBuiltOnce: a gate's Redis keys are built once, when the gate is made, not at each
// reservation: a lane's fairness keys cost the lane's own key only (its name, the key
// and its boxing), and each key is the one its key function builds.
func TestGate_KeysBuiltOnce(t *testing.T) { // not parallel: testing.AllocsPerRun
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	t.Cleanup(func() { _ = rdb.Close() })
	l, err := New(rdb, &Config{Prefix: "llmq:test:"})
	require.NoError(t, err)
	g := l.Gate("sk-main", "main")
	p, tag := l.cfg.Prefix, g.tag
	lane := &Lane{Tenant: "acme", Weight: 1, Priority: PriorityNormal, Ticket: "job-1",
		Since: time.UnixMicro(1)}

	require.Equal(t, sent(t, []any{fairKey(p, tag), fairLanesKey(p, tag), fairDeadlineKey(p, tag),
		fairLaneKey(p, tag) + lane.name()}), sent(t, g.appendFairKeys(nil, new(redisscript.Args), lane)))
	want := gateKeys{rate: rateKey(p, tag), token: tokenKey(p, tag),
		grant: grantKey(p, tag), pause: pauseKey(p, tag), budget: budgetKey(p, tag),
		fair: fairKey(p, tag), fairLanes: fairLanesKey(p, tag),
		fairDeadline: fairDeadlineKey(p, tag), fairLane: fairLaneKey(p, tag), fairLaneArg: fairLaneKey(p, tag)}
	want.rateOnly = []any{want.rate}
	want.rateToken = []any{want.rate, want.token}
	want.tokenGrant = []any{want.token, want.grant}
	require.Equal(t, want, g.keys)

	// The call's Args alone, the lane's key formatted into it; the caller's slice has room. (The
	// lane's name, its key and the key boxed made it 3; building the gate's keys too, 6, and the
	// slice of them 1 more.)
	buf := make([]any, 0, 4)
	allocs := testing.AllocsPerRun(100, func() { _ = g.appendFairKeys(buf[:0], new(redisscript.Args), lane) })
	require.LessOrEqual(t, allocs, 1.0, "allocations per appendFairKeys")
}

// sent is each of args as go-redis writes it: a string, an integer's decimal digits, or an
// encoding.BinaryMarshaler's bytes (a redisscript.Args argument).
func sent(t *testing.T, args []any) []string {
	t.Helper()
	out := make([]string, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case string:
			out[i] = v
		case int:
			out[i] = strconv.Itoa(v)
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		case encoding.BinaryMarshaler:
			b, err := v.MarshalBinary()
			require.NoError(t, err)
			out[i] = string(b)
		default:
			t.Fatalf("argument %d: unexpected type %T", i, a)
		}
	}
	return out
}
