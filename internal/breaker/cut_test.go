package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
)

// A Failure report whose reply is lost after Redis ran it (the connection cut: a failover, a
// proxy restart, CLIENT KILL) is sent again by go-redis on a new connection: the retry must not
// count the failure twice, or fewer failures than Threshold open the breaker.
func TestReport_LostReplyCountsOnce(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	clock := clocktest.New(t0)
	rdb, cut := redistest.CutClient(t)
	br, err := breaker.New(rdb, &breaker.Config{Prefix: prefix, Now: clock.Now, Threshold: 3})
	require.NoError(t, err)
	c := br.Circuit(testID, testName)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	fail := func() breaker.State {
		a, err := c.Allow(ctx)
		require.NoError(t, err)
		require.True(t, a.Allowed)
		st, err := c.Report(ctx, a, breaker.Failure)
		require.NoError(t, err)
		return st
	}

	require.Equal(t, breaker.Closed, fail(), "Redis caches the report's script (a NOSCRIPT runs nothing)")
	cut.Arm("failure")
	require.Equal(t, breaker.Closed, fail(), "the second failure, its reply lost")
	require.Equal(t, 1, cut.Cuts())
	st, err := c.Status(ctx)
	require.NoError(t, err)
	require.Equal(t, breaker.Closed, st.State, "two failures of three: still closed")
	require.Equal(t, breaker.Open, fail(), "the third failure opens it")
}

// An Allow that made the caller the half-open probe, its reply lost after Redis ran it, is sent
// again by go-redis: the retry must get the probe, not find it out. Otherwise nobody sends it,
// and every caller of the credential is refused for ProbeTimeout (2 minutes by default) after
// the cooldown ended.
func TestAllow_LostReplyKeepsTheProbe(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	clock := clocktest.New(t0)
	rdb, cut := redistest.CutClient(t)
	br, err := breaker.New(rdb, &breaker.Config{Prefix: prefix, Now: clock.Now, Threshold: 1})
	require.NoError(t, err)
	c := br.Circuit(testID, testName)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	a, err := c.Allow(ctx) // Redis caches the script (a NOSCRIPT runs nothing)
	require.NoError(t, err)
	st, err := c.Report(ctx, a, breaker.Failure)
	require.NoError(t, err)
	require.Equal(t, breaker.Open, st)
	clock.Advance(breaker.DefaultCooldown)

	cut.Arm(prefix + redisscript.CredentialTag(testID) + ":cb")
	probe, err := c.Allow(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, cut.Cuts(), "the admission's reply was lost")
	require.True(t, probe.Allowed, "the retry got the probe the first run granted")
	require.True(t, probe.Probe)

	other, err := c.Allow(ctx)
	require.NoError(t, err)
	require.False(t, other.Allowed, "the probe is out: the others wait for its answer")
	st, err = c.Report(ctx, probe, breaker.Success)
	require.NoError(t, err)
	require.Equal(t, breaker.Closed, st, "the probe's Success closes the breaker")
}

// A cold breaker's lease granted twice (the first reply lost) would hold one of Threshold's
// cold-start slots for ProbeTimeout: the retry gets the first run's lease.
func TestAllow_LostReplyKeepsTheLease(t *testing.T) {
	t.Parallel()
	prefix := redistest.Prefix(t)
	clock := clocktest.New(t0)
	rdb, cut := redistest.CutClient(t)
	br, err := breaker.New(rdb, &breaker.Config{Prefix: prefix, Now: clock.Now, Threshold: 2,
		SuccessMemory: time.Hour})
	require.NoError(t, err)
	c := br.Circuit(testID, testName)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	first, err := c.Allow(ctx) // Redis caches the script (a NOSCRIPT runs nothing)
	require.NoError(t, err)
	require.True(t, first.ColdStart(), "a cold breaker admits on a lease")
	cut.Arm(prefix + redisscript.CredentialTag(testID) + ":cb")
	second, err := c.Allow(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, cut.Cuts(), "the admission's reply was lost")
	require.True(t, second.Allowed, "the retry got the lease the first run granted")
	st, err := c.Report(ctx, first, breaker.Neutral)
	require.NoError(t, err)
	require.Equal(t, breaker.Closed, st)
	third, err := c.Allow(ctx)
	require.NoError(t, err)
	require.True(t, third.Allowed, "two leases of two: one given back, so one is free")
}
