package breaker_test

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
)

func TestNew(t *testing.T) {
	t.Parallel()

	t.Run("NilClient", func(t *testing.T) {
		t.Parallel()
		_, err := breaker.New(nil, nil)
		require.ErrorContains(t, err, "nil redis client")
	})

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		b, err := breaker.New(redistest.Client(t), nil)
		require.NoError(t, err)
		require.NotNil(t, b)
	})

	for _, tc := range []struct {
		name  string
		cfg   breaker.Config
		field string
	}{
		{"Threshold", breaker.Config{Threshold: -1}, "Threshold"},
		{"Cooldown", breaker.Config{Cooldown: -time.Second}, "Cooldown"},
		{"ProbeTimeout", breaker.Config{ProbeTimeout: time.Microsecond}, "ProbeTimeout"},
		{"Recheck", breaker.Config{Recheck: -1}, "Recheck"},
		{"IdleTTL", breaker.Config{IdleTTL: time.Millisecond}, "IdleTTL"},
		{"CooldownFactorBelowOne", breaker.Config{CooldownFactor: 0.5}, "CooldownFactor"},
		{"CooldownFactorInf", breaker.Config{CooldownFactor: math.Inf(1)}, "CooldownFactor"},
		{"CooldownFactorNaN", breaker.Config{CooldownFactor: math.NaN()}, "CooldownFactor"},
		{"MaxCooldown", breaker.Config{Cooldown: time.Minute, MaxCooldown: time.Second}, "MaxCooldown"},
		{"MaxCooldownNegative", breaker.Config{MaxCooldown: -1}, "MaxCooldown"},
		{"SuccessMemory", breaker.Config{SuccessMemory: time.Microsecond}, "SuccessMemory"},
	} {
		t.Run("Invalid"+tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := breaker.New(redistest.Client(t), &tc.cfg)
			require.ErrorContains(t, err, tc.field)
		})
	}
}

func TestCredential_Closed(t *testing.T) {
	t.Parallel()

	t.Run("OpensAtExactlyThreshold", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		for i := range breaker.DefaultThreshold - 1 {
			require.Equal(t, breaker.Closed, b.send(t, i, breaker.Failure))
			require.Equal(t, i+1, b.status(t).Failures)
		}
		require.Equal(t, 0, b.transitions(t, breaker.Open))
		b.clock.Advance(time.Second)
		require.Equal(t, breaker.Open, b.send(t, 1, breaker.Failure))
		require.Equal(t, 1, b.transitions(t, breaker.Open))
		require.Equal(t, breaker.Status{
			State: breaker.Open,
			Since: t0.Add(time.Second),
			Until: t0.Add(time.Second + breaker.DefaultCooldown),
		}, b.status(t))
		require.Equal(t, 1.0, b.stateGauge(t, breaker.Open))
		require.Equal(t, 0.0, b.stateGauge(t, breaker.Closed))
	})

	t.Run("SuccessResets", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) { c.Threshold = 3 })
		for i := range 10 {
			require.Equal(t, breaker.Closed, b.send(t, i, breaker.Failure))
			require.Equal(t, breaker.Closed, b.send(t, i+1, breaker.Failure))
			require.Equal(t, 2, b.status(t).Failures)
			require.Equal(t, breaker.Closed, b.send(t, i, breaker.Success))
			require.Equal(t, 0, b.status(t).Failures)
		}
		require.Equal(t, 0, b.transitions(t, breaker.Open))
		require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Failure))
		require.Equal(t, breaker.Closed, b.send(t, 1, breaker.Failure))
		require.Equal(t, breaker.Open, b.send(t, 0, breaker.Failure))
	})

	// Neutral (4xx, 429 with Retry-After, not sent) says nothing about the provider's health:
	// it neither counts as a failure nor resets the count.
	t.Run("NeutralNeitherCountsNorResets", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) { c.Threshold = 3 })
		for i := range 20 {
			require.Equal(t, breaker.Closed, b.send(t, i, breaker.Neutral))
		}
		require.Equal(t, 0, b.status(t).Failures)
		require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Failure))
		require.Equal(t, breaker.Closed, b.send(t, 1, breaker.Neutral))
		require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Failure))
		require.Equal(t, breaker.Closed, b.send(t, 1, breaker.Neutral))
		require.Equal(t, 2, b.status(t).Failures)
		require.Equal(t, breaker.Open, b.send(t, 0, breaker.Failure))
	})

	// Changed by the cold-start cap: a healthy credential now keeps one key, its last Success,
	// but once warm neither Allow nor a Success writes to it (until SuccessMemory/16 passes).
	t.Run("WarmAllowWritesNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Success))
		ks := keys(t, b)
		require.Len(t, ks, 1, "the breaker hash only: the lifted cap leaves no slots behind")
		before := hash(t, b, ks[0])
		for i := range 10 {
			b.clock.Advance(time.Millisecond) // a write of the last Success would show
			a := b.admit(t, i)
			require.Equal(t, breaker.Admission{Allowed: true, State: breaker.Closed}, zeroGen(a))
			st, err := b.creds[i%2].Report(t.Context(), a, breaker.Success)
			require.NoError(t, err)
			require.Equal(t, breaker.Closed, st)
		}
		require.Equal(t, ks, keys(t, b))
		require.Equal(t, before, hash(t, b, ks[0]), "a warm credential's Allow and Success write nothing")
		require.Equal(t, breaker.Status{State: breaker.Closed}, b.status(t))
	})
}

func TestCredential_Open(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	opened := b.open(t)
	end := opened.Add(breaker.DefaultCooldown)

	for _, step := range []time.Duration{0, time.Second, breaker.DefaultCooldown - time.Second - time.Millisecond} {
		b.clock.Advance(step)
		for _, c := range b.creds {
			a, err := c.Allow(ctx)
			require.NoError(t, err)
			require.False(t, a.Allowed)
			require.False(t, a.Probe)
			require.Equal(t, breaker.Open, a.State)
			require.True(t, end.Equal(a.RetryAt), "RetryAt %v, want the cooldown's end %v", a.RetryAt, end)
			require.Equal(t, end.Sub(b.clock.Now()), a.Wait)
		}
	}
	require.Equal(t, 6.0, b.metric(t, "llmq_breaker_rejected_total", map[string]string{"credential": testName}))

	// The cooldown is over: 50 callers over two clients at once, exactly one probe.
	b.clock.Advance(time.Millisecond)
	as := b.allow50(t)
	n, probe := probes(t, as)
	require.Equal(t, 1, n)
	require.Equal(t, breaker.HalfOpen, probe.State)
	require.True(t, probe.RetryAt.IsZero())
	require.Zero(t, probe.Wait)
	for _, a := range as {
		if !a.Allowed {
			require.Equal(t, breaker.HalfOpen, a.State)
			require.True(t, b.clock.Now().Add(breaker.DefaultRecheck).Equal(a.RetryAt), "RetryAt %v", a.RetryAt)
			require.Equal(t, breaker.DefaultRecheck, a.Wait)
		}
	}
	require.Equal(t, 1, b.transitions(t, breaker.HalfOpen))
	require.Equal(t, 55.0, b.metric(t, "llmq_breaker_rejected_total", map[string]string{"credential": testName}))
	st := b.status(t)
	require.Equal(t, breaker.HalfOpen, st.State)
	require.True(t, end.Equal(st.Since))
	require.True(t, end.Add(breaker.DefaultProbeTimeout).Equal(st.Until))

	// Still one probe while it is out, however many ask.
	b.clock.Advance(10 * time.Second)
	n, _ = probes(t, b.allow50(t))
	require.Equal(t, 0, n)
}

func TestCredential_Probe(t *testing.T) {
	t.Parallel()

	// probe opens the breaker, waits out the cooldown and returns the single probe admitted
	// among 50 concurrent callers.
	probe := func(t *testing.T, b *testBundle) breaker.Admission {
		t.Helper()
		b.open(t)
		b.clock.Advance(breaker.DefaultCooldown)
		n, p := probes(t, b.allow50(t))
		require.Equal(t, 1, n)
		return p
	}

	t.Run("SuccessCloses", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		p := probe(t, b)
		b.clock.Advance(3 * time.Second)
		st, err := b.creds[1].Report(t.Context(), p, breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
		require.Equal(t, breaker.Status{State: breaker.Closed, Since: b.clock.Now()}, b.status(t))
		require.Equal(t, 1, b.transitions(t, breaker.Closed))
		require.Equal(t, 1.0, b.stateGauge(t, breaker.Closed))

		for _, a := range b.allow50(t) {
			require.True(t, a.Allowed)
			require.False(t, a.Probe)
			require.Equal(t, breaker.Closed, a.State)
		}
		// The count was cleared: Threshold more failures to open again.
		require.Equal(t, 1, b.transitions(t, breaker.Open))
		b.open(t)
		require.Equal(t, 2, b.transitions(t, breaker.Open))
	})

	t.Run("FailureReopens", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		p := probe(t, b)
		b.clock.Advance(7 * time.Second)
		st, err := b.creds[0].Report(t.Context(), p, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.Open, st)
		require.Equal(t, 2, b.transitions(t, breaker.Open))

		// Changed by the cooldown backoff: a failed probe grows the cooldown by the default
		// factor (1.5).
		grown := time.Duration(float64(breaker.DefaultCooldown) * breaker.DefaultCooldownFactor)
		end := b.clock.Now().Add(grown)
		require.Equal(t, breaker.Status{State: breaker.Open, Since: b.clock.Now(), Until: end}, b.status(t))
		for _, a := range b.allow50(t) {
			require.False(t, a.Allowed)
			require.Equal(t, breaker.Open, a.State)
			require.True(t, end.Equal(a.RetryAt), "a fresh cooldown from the probe's failure: RetryAt %v, want %v", a.RetryAt, end)
		}
		b.clock.Advance(grown - time.Millisecond)
		n, _ := probes(t, b.allow50(t))
		require.Zero(t, n)
		b.clock.Advance(time.Millisecond)
		n, _ = probes(t, b.allow50(t))
		require.Equal(t, 1, n)
		require.Equal(t, 2, b.transitions(t, breaker.HalfOpen))
	})

	t.Run("TimeoutReplacesProbe", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		old := probe(t, b)
		deadline := b.clock.Now().Add(breaker.DefaultProbeTimeout)

		b.clock.Advance(breaker.DefaultProbeTimeout - 300*time.Millisecond)
		as := b.allow50(t)
		n, _ := probes(t, as)
		require.Equal(t, 0, n, "no second probe before ProbeTimeout")
		for _, a := range as {
			require.True(t, deadline.Equal(a.RetryAt), "the re-check is capped at the probe's deadline: %v", a.RetryAt)
			require.Equal(t, 300*time.Millisecond, a.Wait)
		}

		b.clock.Advance(300 * time.Millisecond)
		n, p := probes(t, b.allow50(t))
		require.Equal(t, 1, n, "exactly one replacement probe")
		require.Equal(t, 1, b.transitions(t, breaker.HalfOpen), "replacing a probe is no transition")

		// The replaced probe answers late: it no longer decides.
		st, err := b.creds[0].Report(t.Context(), old, breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.HalfOpen, st)
		st, err = b.creds[1].Report(t.Context(), old, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.HalfOpen, st)
		require.Equal(t, breaker.HalfOpen, b.status(t).State)

		st, err = b.creds[1].Report(t.Context(), p, breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
	})

	// A probe that proves nothing (a 4xx, or it was never sent) hands the probe on at once.
	t.Run("NeutralHandsOn", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		p := probe(t, b)
		st, err := b.creds[0].Report(t.Context(), p, breaker.Neutral)
		require.NoError(t, err)
		require.Equal(t, breaker.HalfOpen, st)
		st, err = b.creds[0].Report(t.Context(), p, breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.HalfOpen, st, "one report per admission")

		n, p2 := probes(t, b.allow50(t))
		require.Equal(t, 1, n)
		st, err = b.creds[1].Report(t.Context(), p2, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.Open, st)
	})
}

// Requests in flight when the breaker opened report late: they must not extend the cooldown,
// re-open it, or count in the next closed period.
func TestCredential_StaleReports(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	// A warm credential (changed by the cold-start cap, which would admit only Threshold of
	// these 20 on a new one).
	require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Success))
	var inflight []breaker.Admission
	for i := range 20 {
		inflight = append(inflight, b.admit(t, i))
	}
	opened := b.open(t)
	want := b.status(t)

	b.clock.Advance(10 * time.Second)
	for i, a := range inflight[:10] {
		st, err := b.creds[i%2].Report(ctx, a, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.Open, st)
	}
	require.Equal(t, want, b.status(t), "late failures do not extend the cooldown")
	require.True(t, opened.Add(breaker.DefaultCooldown).Equal(want.Until))

	b.clock.Advance(breaker.DefaultCooldown)
	p := b.admit(t, 0)
	require.True(t, p.Probe)
	for i, a := range inflight[10:15] {
		st, err := b.creds[i%2].Report(ctx, a, breaker.Success)
		require.NoError(t, err)
		require.Equal(t, breaker.HalfOpen, st, "only the probe closes")
	}
	st, err := b.creds[0].Report(ctx, p, breaker.Success)
	require.NoError(t, err)
	require.Equal(t, breaker.Closed, st)

	for i, a := range inflight[15:] {
		st, err := b.creds[i%2].Report(ctx, a, breaker.Failure)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, st)
	}
	require.Equal(t, 0, b.status(t).Failures, "failures from before the outage do not count after it")
	require.Equal(t, 1, b.transitions(t, breaker.Open))
}

func TestCredential_Report(t *testing.T) {
	t.Parallel()

	t.Run("ErrRefusedAdmission", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.open(t)
		a, err := b.creds[0].Allow(t.Context())
		require.NoError(t, err)
		require.False(t, a.Allowed)
		_, err = b.creds[0].Report(t.Context(), a, breaker.Success)
		require.ErrorContains(t, err, "refused")
		require.Equal(t, breaker.Open, b.status(t).State)
	})

	t.Run("ErrInvalidOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t, func(c *breaker.Config) { c.Threshold = 1 })
		a := b.admit(t, 0)
		_, err := b.creds[0].Report(t.Context(), a, breaker.Outcome(0))
		require.ErrorContains(t, err, "invalid outcome")
		require.Equal(t, breaker.Closed, b.status(t).State)
	})

	t.Run("ErrRedis", func(t *testing.T) {
		t.Parallel()
		c := redistest.Client(t)
		br, err := breaker.New(c, &breaker.Config{Prefix: redistest.Prefix(t)})
		require.NoError(t, err)
		cred := br.Circuit(testID, testName)
		require.NoError(t, c.Close())
		_, err = cred.Allow(t.Context())
		require.ErrorContains(t, err, "breaker allow")
		_, err = cred.Report(t.Context(), breaker.Admission{Allowed: true}, breaker.Failure)
		require.ErrorContains(t, err, "breaker report")
		_, err = cred.Status(t.Context())
		require.ErrorContains(t, err, "breaker status")
	})
}

func TestCredential_Keys(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *breaker.Config) { c.IdleTTL = time.Minute })
	ctx := t.Context()

	require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Failure))
	ks := keys(t, b)
	require.Len(t, ks, 1)
	require.True(t, strings.HasPrefix(ks[0], b.prefix+"{"), ks[0])
	require.True(t, strings.HasSuffix(ks[0], "}:cb"), ks[0])
	require.NotContains(t, ks[0], testID)
	ttl, err := b.rdb.PTTL(ctx, ks[0]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 55*time.Second)
	require.LessOrEqual(t, ttl, time.Minute, "a closed key expires IdleTTL after its last write")

	require.Equal(t, breaker.Closed, b.send(t, 1, breaker.Success))
	b.open(t)
	ttl, err = b.rdb.PTTL(ctx, ks[0]).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, breaker.DefaultCooldown+time.Hour, "an open key outlives its cooldown by far")

	// Another name for the same key shares its breaker; another key does not.
	br, err := breaker.New(b.rdb, &breaker.Config{Prefix: b.prefix, Now: b.clock.Now})
	require.NoError(t, err)
	a, err := br.Circuit(testID, "alias").Allow(ctx)
	require.NoError(t, err)
	require.False(t, a.Allowed)
	a, err = br.Circuit("sk-other", testName).Allow(ctx)
	require.NoError(t, err)
	require.True(t, a.Allowed)
}

// With no injected clock the scripts use Redis TIME.
func TestCredential_RedisClock(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *breaker.Config) {
		c.Now = nil
		c.Threshold = 1
		c.Cooldown = time.Hour
	})
	before := time.Now()
	require.Equal(t, breaker.Open, b.send(t, 0, breaker.Failure))
	a, err := b.creds[1].Allow(t.Context())
	require.NoError(t, err)
	after := time.Now()
	require.False(t, a.Allowed)
	require.Greater(t, a.Wait, time.Hour-time.Minute)
	require.LessOrEqual(t, a.Wait, time.Hour)
	// Redis runs on this machine: its clock is ours within the test's duration (and a margin).
	require.WithinRange(t, a.RetryAt, before.Add(time.Hour-time.Second), after.Add(time.Hour+time.Second))
}

// keys lists the breaker's keys under b's prefix, leaving out the replies kept for a retry of
// their calls (see allowScript), which it checks expire by themselves within
// redisscript.CallKeep.
func keys(t *testing.T, b *testBundle) []string {
	t.Helper()
	ks, err := b.rdb.Keys(t.Context(), b.prefix+"*").Result()
	require.NoError(t, err)
	return slices.DeleteFunc(ks, func(k string) bool {
		if !strings.Contains(k, "}:cb:call:") {
			return false
		}
		ttl, err := b.rdb.PTTL(t.Context(), k).Result()
		require.NoError(t, err)
		require.Positive(t, ttl, "%s must expire by itself", k)
		require.LessOrEqual(t, ttl, redisscript.CallKeep)
		return true
	})
}

// hash returns the fields of the hash at key.
func hash(t *testing.T, b *testBundle, key string) map[string]string {
	t.Helper()
	h, err := b.rdb.HGetAll(t.Context(), key).Result()
	require.NoError(t, err)
	return h
}

// zeroGen returns a with its unexported generation and lease dropped, for comparisons.
func zeroGen(a breaker.Admission) breaker.Admission {
	return breaker.Admission{Allowed: a.Allowed, Probe: a.Probe, Capped: a.Capped, State: a.State, RetryAt: a.RetryAt, Wait: a.Wait}
}

// A closed breaker's key expires IdleTTL after its last transition however busy the credential
// (a warm breaker with no cold-start cap writes nothing), and starts again at generation 0. The
// failures of requests admitted before carry the old generation: the first recreated the key, and
// the rest were taken for stale, so Threshold consecutive failures left the breaker closed.
func TestReport_FailuresAdmittedBeforeTheKeyExpiredCount(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *breaker.Config) { c.SuccessMemory = -1 })
	b.open(t)
	b.clock.Advance(breaker.DefaultCooldown)
	require.Equal(t, breaker.Closed, b.send(t, 0, breaker.Success), "the probe closes it")
	var inflight []breaker.Admission
	for i := range breaker.DefaultThreshold {
		inflight = append(inflight, b.admit(t, i))
	}
	require.NoError(t, b.rdb.Del(t.Context(), b.creds[0].Key()).Err()) // the closed key expired

	var st breaker.State
	for i, a := range inflight {
		var err error
		st, err = b.creds[i%2].Report(t.Context(), a, breaker.Failure)
		require.NoError(t, err)
	}
	require.Equal(t, breaker.Open, st, "%d consecutive failures", breaker.DefaultThreshold)
}
