package breaker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
)

// allowed returns the allowed admissions among as, requiring each to be a closed, non-probe
// admission and each refused one to be a cold-start refusal at RetryAt.
func allowed(t *testing.T, as []breaker.Admission, retryAt time.Time) []breaker.Admission {
	t.Helper()
	var out []breaker.Admission
	for _, a := range as {
		require.Equal(t, breaker.Closed, a.State)
		require.False(t, a.Probe)
		if a.Allowed {
			require.False(t, a.Capped)
			require.True(t, a.RetryAt.IsZero())
			out = append(out, a)
			continue
		}
		require.True(t, a.Capped, "a closed breaker refuses only by its cold-start cap")
		require.True(t, retryAt.Equal(a.RetryAt), "RetryAt %v, want %v", a.RetryAt, retryAt)
	}
	return out
}

func TestCredential_ColdStart(t *testing.T) {
	t.Parallel()

	// The outage benchmark's opening burst: a new credential, a provider already down, and
	// every caller at once. Opening costs exactly Threshold requests.
	t.Run("BurstCostsExactlyThreshold", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		require.Equal(t, breaker.Status{State: breaker.Closed, Capped: true}, b.status(t))

		out := allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck))
		require.Len(t, out, breaker.DefaultThreshold)
		require.Equal(t, 45.0, b.metric(t, "llmq_breaker_rejected_total", map[string]string{"credential": testName}))
		require.Equal(t, breaker.Status{State: breaker.Closed, Capped: true, InFlight: breaker.DefaultThreshold}, b.status(t))

		// Each failure reported frees a slot but counts: the room stays Threshold − failures −
		// requests out, so nobody else gets in before the breaker opens.
		for i, a := range out {
			b.clock.Advance(100 * time.Millisecond)
			st, err := b.creds[i%2].Report(t.Context(), a, breaker.Failure)
			require.NoError(t, err)
			if i < len(out)-1 {
				require.Equal(t, breaker.Closed, st)
				require.Empty(t, allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck)))
				continue
			}
			require.Equal(t, breaker.Open, st)
		}
		require.Equal(t, 1, b.transitions(t, breaker.Open))
		require.Equal(t, breaker.Status{State: breaker.Open, Since: b.clock.Now(), Until: b.clock.Now().Add(breaker.DefaultCooldown)}, b.status(t))
		require.Len(t, keys(t, b), 1, "opening drops the cold-start slots")
	})

	t.Run("SuccessLiftsCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		out := allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck))
		require.Len(t, out, breaker.DefaultThreshold)

		b.clock.Advance(time.Second)
		st, err := b.creds[0].Report(t.Context(), out[0], breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
		require.Equal(t, breaker.Status{State: breaker.Closed}, b.status(t))
		require.Len(t, allowed(t, b.allow50(t), time.Time{}), 50, "warm: everyone goes")

		// The requests still out report normally: their failures count as they always did.
		for _, a := range out[1:] {
			st, err := b.creds[1].Report(t.Context(), a, breaker.Failure)
			require.NoError(t, err)
			require.Equal(t, breaker.Closed, st)
		}
		require.Equal(t, breaker.DefaultThreshold-1, b.status(t).Failures)
		require.Equal(t, breaker.Open, b.send(t, 0, breaker.Failure))
	})

	// The requests out when a Success lifted the cap hold no slot if the credential goes cold
	// again before they report (SuccessMemory 1m < ProbeTimeout 2m).
	t.Run("LiftedCapForgetsSlots", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		out := allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck))
		require.Len(t, out, breaker.DefaultThreshold)
		st, err := b.creds[0].Report(t.Context(), out[0], breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
		b.clock.Advance(breaker.DefaultSuccessMemory)
		require.Equal(t, breaker.Status{State: breaker.Closed, Capped: true}, b.status(t))
		require.Len(t, allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck)), breaker.DefaultThreshold)
	})

	// Requests admitted while warm can open a breaker that has gone cold with slots out; their
	// slots must not outlive the outage and hold back the next cold start.
	t.Run("OpeningDropsSlots", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) { c.Cooldown = 2 * time.Second })
		require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Success))
		warm := allowed(t, b.allow50(t), time.Time{})[:breaker.DefaultThreshold]
		b.clock.Advance(breaker.DefaultSuccessMemory)
		require.Len(t, allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck)), breaker.DefaultThreshold)
		for _, a := range warm {
			_, err := b.creds[0].Report(t.Context(), a, breaker.Failure)
			require.NoError(t, err)
		}
		require.Equal(t, breaker.Open, b.status(t).State)

		b.clock.Advance(2 * time.Second)
		p := b.admit(t, 0)
		require.True(t, p.Probe)
		st, err := b.creds[0].Report(t.Context(), p, breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
		b.clock.Advance(breaker.DefaultSuccessMemory) // cold again, before the old slots' deadlines
		require.Equal(t, breaker.Status{State: breaker.Closed, Capped: true, Since: b.clock.Now().Add(-breaker.DefaultSuccessMemory)}, b.status(t))
		require.Len(t, allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck)), breaker.DefaultThreshold)
	})

	t.Run("NeutralFreesSlot", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		out := allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck))
		require.Len(t, out, breaker.DefaultThreshold)
		st, err := b.creds[0].Report(t.Context(), out[0], breaker.Neutral)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
		require.Equal(t, breaker.Status{State: breaker.Closed, Capped: true, InFlight: breaker.DefaultThreshold - 1}, b.status(t))
		require.Len(t, allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck)), 1)
	})

	// A caller that crashed never reports: its slot frees after ProbeTimeout, and refused
	// callers are told to come back then if that is sooner than Recheck.
	t.Run("LeaseExpires", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		first := b.clock.Now().Add(breaker.DefaultProbeTimeout)
		require.Len(t, allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck)), breaker.DefaultThreshold)

		b.clock.Advance(breaker.DefaultProbeTimeout - 300*time.Millisecond)
		as := b.allow50(t)
		require.Empty(t, allowed(t, as, first))
		require.Equal(t, 300*time.Millisecond, as[0].Wait)

		b.clock.Advance(300 * time.Millisecond)
		require.Len(t, allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck)), breaker.DefaultThreshold)
	})

	t.Run("ReturnsAfterSuccessMemory", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		const refresh = breaker.DefaultSuccessMemory / 16
		require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Success))
		recorded := b.clock.Now()

		// A Success sooner than SuccessMemory/16 after the recorded one is not recorded.
		b.clock.Advance(refresh - time.Millisecond)
		require.Equal(t, breaker.Closed, b.send(t, 1, breaker.Success))

		b.clock.Set(recorded.Add(breaker.DefaultSuccessMemory - time.Millisecond))
		require.Len(t, allowed(t, b.allow50(t), time.Time{}), 50)
		require.False(t, b.status(t).Capped)

		b.clock.Set(recorded.Add(breaker.DefaultSuccessMemory))
		require.True(t, b.status(t).Capped)
		out := allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck))
		require.Len(t, out, breaker.DefaultThreshold, "idle for SuccessMemory: the cap is back")

		// A Success SuccessMemory/16 or more after the recorded one is recorded.
		st, err := b.creds[0].Report(t.Context(), out[0], breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
		recorded = b.clock.Now()
		b.clock.Advance(refresh)
		require.Equal(t, breaker.Closed, b.send(t, 1, breaker.Success))
		b.clock.Set(recorded.Add(refresh + breaker.DefaultSuccessMemory - time.Millisecond))
		require.False(t, b.status(t).Capped)
		b.clock.Advance(time.Millisecond)
		require.True(t, b.status(t).Capped)
	})

	// A closed breaker that has counted failures, then went quiet, comes back capped at the
	// room its failures leave: Threshold − failures.
	t.Run("RoomShrinksWithFailures", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Failure))
		require.Equal(t, breaker.Closed, b.send(t, 1, breaker.Failure))
		out := allowed(t, b.allow50(t), b.clock.Now().Add(breaker.DefaultRecheck))
		require.Len(t, out, breaker.DefaultThreshold-2)
		for _, a := range out {
			_, err := b.creds[0].Report(t.Context(), a, breaker.Failure)
			require.NoError(t, err)
		}
		require.Equal(t, breaker.Open, b.status(t).State)
		require.Equal(t, 1, b.transitions(t, breaker.Open))
	})

	// A threshold lowered under a stored count still lets one request out at a time.
	t.Run("AtLeastOneSlot", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		for i := range 3 {
			require.Equal(t, breaker.Closed, b.send(t, i, breaker.Failure))
		}
		br, err := breaker.New(b.rdb, &breaker.Config{Prefix: b.prefix, Now: b.clock.Now, Threshold: 2})
		require.NoError(t, err)
		c := br.Circuit(testID, testName)
		a, err := c.Allow(t.Context())
		require.NoError(t, err)
		require.True(t, a.Allowed)
		a2, err := c.Allow(t.Context())
		require.NoError(t, err)
		require.True(t, a2.Capped)
		st, err := c.Report(t.Context(), a, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.Open, st)
	})

	t.Run("Disabled", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) { c.SuccessMemory = -1 })
		require.Len(t, allowed(t, b.allow50(t), time.Time{}), 50)
		require.Empty(t, keys(t, b), "without the cap a healthy credential leaves no key")
		require.Equal(t, breaker.Status{State: breaker.Closed}, b.status(t))
		require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Success))
		require.Empty(t, keys(t, b))
	})
}
