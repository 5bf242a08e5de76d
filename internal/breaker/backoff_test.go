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

	// The defaults: Cooldown 2 s, growing by 1.4 after each failed probe (in whole µs, rounded
	// down) up to 30 s. A short outage is seen within seconds; a long one costs two probes a
	// minute once the cooldown has reached its cap (after about a minute and a half), and a
	// success resets the backoff.
	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.open(t)
		us := time.Microsecond
		periods := []time.Duration{2 * s, 2800000 * us, 3919999 * us, 5487998 * us, 7683197 * us, 10756475 * us,
			15059064 * us, 21082689 * us, 29515764 * us, 30 * s, 30 * s, 30 * s, 30 * s, 30 * s, 30 * s, 30 * s, 30 * s}
		failProbes(t, b, periods)
		var elapsed time.Duration
		for i, p := range periods {
			if elapsed >= 5*time.Minute-30*s {
				require.GreaterOrEqual(t, p, 30*s, "period %d: at most 2 probes a minute after the first 5 minutes", i)
			}
			elapsed += p
		}
		require.Greater(t, elapsed, 5*time.Minute, "the outage ran past its first 5 minutes")

		// A successful probe closes the breaker and resets the backoff.
		b.clock.Advance(30 * s)
		p := b.admit(t, 0)
		require.True(t, p.Probe)
		st, err := b.creds[1].Report(t.Context(), p, breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
		b.open(t)
		failProbes(t, b, []time.Duration{2 * s, 2800000 * us, 3919999 * us})
		require.Equal(t, 2+len(periods)+3, b.transitions(t, breaker.Open))
	})

	t.Run("DoublingUpToTwiceTheCooldown", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) {
			c.Cooldown = 2 * s
			c.CooldownFactor = 2
			c.MaxCooldown = 4 * s
		})
		b.open(t)
		failProbes(t, b, []time.Duration{2 * s, 4 * s, 4 * s, 4 * s})
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
			c.CooldownFactor = 2
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
