package tenant_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
)

func TestRateLimiter_BurstThenRate(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	lim, err := tenant.NewRateLimiter(redistest.Client(t), &tenant.RateLimiterConfig{
		Rate: tenant.Rate{PerSecond: 2, Burst: 3}, Prefix: redistest.Prefix(t), Now: clock.Now,
	})
	require.NoError(t, err)
	ctx := context.Background()

	// A fresh tenant has its whole burst.
	for range 3 {
		d, err := lim.Allow(ctx, "acme")
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := lim.Allow(ctx, "acme")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, 500*time.Millisecond, d.RetryAfter)
	require.Equal(t, 1, d.RetryAfterSeconds())

	// Another tenant is not affected.
	d, err = lim.Allow(ctx, "other")
	require.NoError(t, err)
	require.True(t, d.Allowed)

	// A refusal takes nothing: after the wait exactly one more is allowed.
	clock.Advance(499 * time.Millisecond)
	d, err = lim.Allow(ctx, "acme")
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Equal(t, time.Millisecond, d.RetryAfter)
	clock.Advance(time.Millisecond)
	d, err = lim.Allow(ctx, "acme")
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = lim.Allow(ctx, "acme")
	require.NoError(t, err)
	require.False(t, d.Allowed)

	// After a long idle spell the burst is back, and no more than the burst.
	clock.Advance(time.Hour)
	allowed := 0
	for range 10 {
		d, err := lim.Allow(ctx, "acme")
		require.NoError(t, err)
		if d.Allowed {
			allowed++
		}
	}
	require.Equal(t, 3, allowed)
}

func TestRateLimiter_RetryAfterSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		wait time.Duration
		want int
	}{{time.Microsecond, 1}, {time.Second, 1}, {time.Second + time.Microsecond, 2}, {59500 * time.Millisecond, 60}} {
		require.Equal(t, tc.want, tenant.Decision{RetryAfter: tc.wait}.RetryAfterSeconds(), "wait %s", tc.wait)
	}
}

// TestRateLimiter_SharedAcrossReplicas runs two limiters (two API replicas) on Redis TIME: together
// they admit the burst, not twice it.
func TestRateLimiter_SharedAcrossReplicas(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	prefix := redistest.Prefix(t)
	cfg := &tenant.RateLimiterConfig{Rate: tenant.Rate{PerSecond: 0.001, Burst: 10}, Prefix: prefix}
	a, err := tenant.NewRateLimiter(rdb, cfg)
	require.NoError(t, err)
	b, err := tenant.NewRateLimiter(redistest.Client(t), cfg)
	require.NoError(t, err)

	var allowed atomic.Int64
	var wg sync.WaitGroup
	for i := range 50 {
		lim := a
		if i%2 == 1 {
			lim = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := lim.Allow(context.Background(), "acme")
			if err != nil {
				t.Error(err)
				return
			}
			if d.Allowed {
				allowed.Add(1)
			} else if d.RetryAfterSeconds() < 900 {
				t.Errorf("retry after %s: want about 1000s", d.RetryAfter)
			}
		}()
	}
	wg.Wait()
	require.EqualValues(t, 10, allowed.Load())
	ttl, err := rdb.PTTL(context.Background(), prefix+"tenant:{acme}:submit").Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Duration(0), "the key expires once the bucket is full again")
}

func TestNewRateLimiter_Validates(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	for _, cfg := range []*tenant.RateLimiterConfig{
		nil, {}, {Rate: tenant.Rate{PerSecond: 1}}, {Rate: tenant.Rate{Burst: 1}}, {Rate: tenant.Rate{PerSecond: -1, Burst: 1}},
	} {
		_, err := tenant.NewRateLimiter(rdb, cfg)
		require.Error(t, err)
	}
}
