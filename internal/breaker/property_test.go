package breaker_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
)

// A provider failing 30% of the time at random, threshold 5: the breaker opens exactly as often
// as the provider's log of answered requests says. Refused calls reach no provider, so the log
// holds only admitted requests; Neutral answers (10%) neither count nor reset, so they are
// dropped from it. In the log, a run of k >= 5 consecutive failures opens the breaker at its
// fifth failure, and each later failure of the run is the next probe, which re-opens it: k-4
// opens. The success ending such a run is a probe and closes the breaker. The first open of a
// run lasts the cooldown, each re-open twice the last, at most 20 s.
// Calls come one at a time, so the cold-start cap (a cold closed breaker admits Threshold less
// its failures, at least one, at a time) never refuses one.
func TestCredential_RandomOutcomes(t *testing.T) {
	t.Parallel()
	const (
		calls       = 1000
		threshold   = 5
		cooldown    = 10 * time.Second
		maxCooldown = 2 * cooldown
	)
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 8}
	total := 0
	for _, seed := range seeds {
		total += expectTransitions(randomOutcomes(seed, calls), threshold, cooldown, maxCooldown).open
	}
	// About 2.5 opens per seed: runs of 5 failures at 30% are rare (the breaker stays nearly
	// closed), so make sure the seeds exercise it at all.
	require.Greater(t, total, 2*len(seeds))

	for _, seed := range seeds {
		t.Run(fmt.Sprintf("Seed%d", seed), func(t *testing.T) {
			t.Parallel()
			outcomes := randomOutcomes(seed, calls)
			want := expectTransitions(outcomes, threshold, cooldown, maxCooldown)

			b := setup(t, func(c *breaker.Config) {
				c.Threshold = threshold
				c.Cooldown = cooldown
				c.CooldownFactor = 2
				c.MaxCooldown = maxCooldown
			})
			ctx := t.Context()
			rng := rand.New(rand.NewPCG(seed, 0xc10c))
			refused := 0
			var opened []time.Time // when each open began, by the report that opened it
			for next := 0; next < calls; {
				b.clock.Advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
				c := b.creds[rng.IntN(2)]
				a, err := c.Allow(ctx)
				require.NoError(t, err)
				if !a.Allowed {
					require.Equal(t, breaker.Open, a.State, "probes report at once: never refused for a probe out")
					require.Positive(t, a.Wait)
					k := len(opened) - 1
					require.True(t, opened[k].Add(want.cooldowns[k]).Equal(a.RetryAt),
						"open %d: RetryAt %v, want %v + %v", k, a.RetryAt, opened[k], want.cooldowns[k])
					refused++
					continue
				}
				st, err := b.creds[rng.IntN(2)].Report(ctx, a, outcomes[next])
				require.NoError(t, err)
				if st == breaker.Open {
					opened = append(opened, b.clock.Now())
				}
				next++
			}
			require.Len(t, opened, want.open)

			require.Equal(t, want.open, b.transitions(t, breaker.Open))
			require.Equal(t, want.halfOpen, b.transitions(t, breaker.HalfOpen))
			require.Equal(t, want.closed, b.transitions(t, breaker.Closed))
			require.Equal(t, float64(refused), b.metric(t, "llmq_breaker_rejected_total", map[string]string{"credential": testName}))
			// Each cooldown is 10 s and calls come 1 s apart on average.
			require.GreaterOrEqual(t, refused, want.open*5)
		})
	}
}

// randomOutcomes returns n outcomes from seed: 30% Failure, 10% Neutral, 60% Success.
func randomOutcomes(seed uint64, n int) []breaker.Outcome {
	rng := rand.New(rand.NewPCG(seed, 0x11ab))
	out := make([]breaker.Outcome, n)
	for i := range out {
		switch r := rng.Float64(); {
		case r < 0.3:
			out[i] = breaker.Failure
		case r < 0.4:
			out[i] = breaker.Neutral
		default:
			out[i] = breaker.Success
		}
	}
	return out
}

type transitions struct {
	open, halfOpen, closed int
	cooldowns              []time.Duration // of each open, in order
}

// expectTransitions counts the transitions the log of answers implies: with Neutral dropped, a
// run of k >= threshold failures opens k-threshold+1 times, and the success ending it closes.
// The first open of a run lasts cooldown; each later one (a failed probe) twice the last, at most
// maxCooldown.
func expectTransitions(log []breaker.Outcome, threshold int, cooldown, maxCooldown time.Duration) transitions {
	var w transitions
	run := 0
	for _, o := range log {
		switch o {
		case breaker.Failure:
			run++
			if run == threshold {
				w.cooldowns = append(w.cooldowns, cooldown)
			} else if run > threshold {
				w.cooldowns = append(w.cooldowns, min(2*w.cooldowns[len(w.cooldowns)-1], maxCooldown))
			}
			if run >= threshold {
				w.open++
			}
		case breaker.Success:
			if run >= threshold {
				w.closed++
			}
			run = 0
		}
	}
	// Every open is followed by a probe unless it is the log's very last answer.
	w.halfOpen = w.open
	if log[len(log)-1] == breaker.Failure && run >= threshold {
		w.halfOpen--
	}
	return w
}
