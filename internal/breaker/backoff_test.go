package breaker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
)

// failProbes waits out each open period and fails its probe, checking that the period
// lasted exactly the next of want: refused one millisecond before its end (with RetryAt = its
// end), probed at its end. It leaves the breaker open after the last failed probe.
func failProbes(t *testing.T, b *testBundle, want []time.Duration) {
	t.Helper()
	for i, cd := range want {
		st := b.status(t)
		require.Equal(t, breaker.Open, st.State)
		require.Equal(t, cd, st.Until.Sub(st.Since), "open period %d", i)
		b.clock.Advance(cd - time.Millisecond)
		a, err := b.creds[i%2].Allow(t.Context())
		require.NoError(t, err)
		require.False(t, a.Allowed)
		require.True(t, st.Until.Equal(a.RetryAt), "open period %d: RetryAt %v, want %v", i, a.RetryAt, st.Until)
		b.clock.Advance(time.Millisecond)
		p := b.admit(t, i)
		require.True(t, p.Probe)
		b.clock.Advance(250 * time.Millisecond) // the probe's round trip
		s, err := b.creds[(i+1)%2].Report(t.Context(), p, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.Open, s)
	}
}

func TestCredential_CooldownBackoff(t *testing.T) {
	t.Parallel()
	const s = time.Second

	// The outage benchmark's settings: Cooldown 2 s, so with the defaults (factor 2, at most
	// 2 × Cooldown) the open periods are 2 s, 4 s, 4 s, ... and a success resets them.
	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) { c.Cooldown = 2 * s })
		b.open(t)
		failProbes(t, b, []time.Duration{2 * s, 4 * s, 4 * s, 4 * s, 4 * s})

		// A successful probe closes the breaker and resets the backoff.
		b.clock.Advance(4 * s)
		p := b.admit(t, 0)
		require.True(t, p.Probe)
		st, err := b.creds[1].Report(t.Context(), p, breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
		b.open(t)
		failProbes(t, b, []time.Duration{2 * s, 4 * s, 4 * s})
		require.Equal(t, 2+8, b.transitions(t, breaker.Open))
	})

	t.Run("FactorAndCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) {
			c.Cooldown = 2 * s
			c.CooldownFactor = 3
			c.MaxCooldown = 100 * s
		})
		b.open(t)
		failProbes(t, b, []time.Duration{2 * s, 6 * s, 18 * s, 54 * s, 100 * s, 100 * s})
	})

	t.Run("FractionalFactor", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) {
			c.Cooldown = 1500 * time.Millisecond
			c.CooldownFactor = 1.5
			c.MaxCooldown = 5 * s
		})
		b.open(t)
		failProbes(t, b, []time.Duration{1500 * time.Millisecond, 2250 * time.Millisecond, 3375 * time.Millisecond, 5 * s, 5 * s})
	})

	t.Run("FactorOneDisables", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) {
			c.Cooldown = 2 * s
			c.CooldownFactor = 1
		})
		b.open(t)
		failProbes(t, b, []time.Duration{2 * s, 2 * s, 2 * s})
	})

	// Only a probe's Failure grows the cooldown: a probe handed on (Neutral) or replaced
	// after ProbeTimeout does not, and neither do stale reports.
	t.Run("OnlyFailedProbesCount", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) {
			c.Cooldown = 2 * s
			c.MaxCooldown = time.Hour
		})
		b.open(t)
		failProbes(t, b, []time.Duration{2 * s})
		b.clock.Advance(4 * s)
		p := b.admit(t, 0)
		st, err := b.creds[0].Report(t.Context(), p, breaker.Neutral)
		require.NoError(t, err)
		require.Equal(t, breaker.HalfOpen, st)
		stale := b.admit(t, 1) // the next probe, which will time out
		b.clock.Advance(breaker.DefaultProbeTimeout)
		p = b.admit(t, 0)
		_, err = b.creds[0].Report(t.Context(), stale, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.HalfOpen, b.status(t).State)
		st, err = b.creds[0].Report(t.Context(), p, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.Open, st)
		failProbes(t, b, []time.Duration{8 * s, 16 * s})
	})
}
