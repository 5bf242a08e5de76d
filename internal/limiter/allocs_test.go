package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

// TestGate_ScriptCallAllocs pins the allocations of the limiter's calls that every job makes, a
// reservation and the observation of its answer: each boxed the script's SHA and every key into
// an interface at every call, in go-redis's Script.Run: 27, 38 and 18 allocations; with the SHA
// boxed once per script and the keys once per gate (redisscript.Script), 22, 27 and 14. The
// bounds are the counts with the arguments that change at every call (the time and call id, the
// limit, the counts) formatted into one buffer (redisscript.Args) instead of a string or a boxed
// integer each: the rest is go-redis's, but for the command and its slice. An observation with
// token limits (ObserveTokens) took 38 before the buffer. A reservation's reply's token limits
// were split with strings.SplitN and strings.Fields (one allocation more for Reserve and
// ReserveAttempt here, where the reply has none; four with them): parseTokenLimits allocates
// nothing. An observation's list of calls grew to take the token buckets' call (one more for
// ObserveTokens).
func TestGate_ScriptCallAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops go-redis's pooled buffers at random")
	}
	b := setup(t, nil)
	ctx := context.Background()
	lim := limiter.Limit{Rate: 1e6, Burst: 1000}
	opts := limiter.AttemptOptions{UnlessPaused: true, FirstAttempt: true}
	obs := limiter.Observation{StatusCode: 200}
	// An answer with token limit headers, as most providers send: its observation of the token
	// buckets rides in the same round trip.
	tokenObs := limiter.Observation{StatusCode: 200, Grant: 1000,
		InputTokens:  limiter.TokenObservation{Known: true, Limit: 400000, Remaining: 398800},
		OutputTokens: limiter.TokenObservation{Known: true, Limit: 80000, Remaining: 79000},
		Tokens:       limiter.TokenObservation{Known: true, Limit: 2000000, Remaining: 1999000}}
	for _, tc := range []struct {
		name string
		call func(g *limiter.Gate) error
		max  float64
	}{
		{name: "Reserve", max: 16, call: func(g *limiter.Gate) error {
			_, err := g.Reserve(ctx, lim)
			return err
		}},
		{name: "ReserveAttempt", max: 16, call: func(g *limiter.Gate) error {
			_, err := g.ReserveAttempt(ctx, lim, tokens.Cost{}, opts)
			return err
		}},
		{name: "Observe", max: 13, call: func(g *limiter.Gate) error { return g.Observe(ctx, obs) }},
		{name: "ObserveTokens", max: 25, call: func(g *limiter.Gate) error { return g.Observe(ctx, tokenObs) }},
	} {
		name := tc.name
		g := b.lim2.Gate("sk-"+name, name)   // each its own credential: its replies the same each time
		require.NoError(t, tc.call(g), name) // the connection, and the script cached
		allocs := testing.AllocsPerRun(200, func() {
			b.clock.Advance(time.Millisecond)
			if err := tc.call(g); err != nil {
				panic(err)
			}
		})
		t.Logf("%s: %.1f allocations", name, allocs)
		require.LessOrEqual(t, allocs, tc.max, "allocations per %s", name)
	}
}

// BenchmarkGate_ScriptCalls measures the limiter's per-job script calls: a
// reservation, an attempt's admission and an observation, on the local Redis.
func BenchmarkGate_ScriptCalls(b *testing.B) {
	ctx := context.Background()
	lim := limiter.Limit{Rate: 1e9, Burst: 1000}
	opts := limiter.AttemptOptions{UnlessPaused: true, FirstAttempt: true}
	for _, bc := range []struct {
		name string
		call func(g *limiter.Gate) error
	}{
		{name: "Reserve", call: func(g *limiter.Gate) error {
			_, err := g.Reserve(ctx, lim)
			return err
		}},
		{name: "ReserveAttempt", call: func(g *limiter.Gate) error {
			_, err := g.ReserveAttempt(ctx, lim, tokens.Cost{}, opts)
			return err
		}},
		{name: "Observe", call: func(g *limiter.Gate) error {
			return g.Observe(ctx, limiter.Observation{StatusCode: 200})
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l, err := limiter.New(redistest.Client(b), &limiter.Config{Prefix: redistest.Prefix(b)})
			require.NoError(b, err)
			g := l.Gate("sk-bench", "bench")
			b.ReportAllocs()
			for b.Loop() {
				if err := bc.call(g); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
