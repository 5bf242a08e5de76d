package tenant_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
)

// TestRateLimiter_WireArgs pins the exact arguments Allow sends: the processes of the last
// release share the script's key and SHA, so however the arguments are built they must reach
// Redis byte for byte as before, with the injected clock and with Redis TIME (an empty "now").
func TestRateLimiter_WireArgs(t *testing.T) {
	t.Parallel()
	w := redistest.NewWire(t)
	prefix := redistest.Prefix(t)
	clock := clocktest.New(time.UnixMicro(1_700_000_000_000_123))
	ctx := context.Background()
	var got []string
	for _, now := range []func() time.Time{clock.Now, nil} {
		lim, err := tenant.NewRateLimiter(w.Client, &tenant.RateLimiterConfig{
			Rate: tenant.Rate{PerSecond: 3, Burst: 700}, Prefix: prefix, Now: now,
		})
		require.NoError(t, err)
		got = append(got, w.CachedEvalSHAs(t, strings.NewReplacer(prefix, "P:"), func() {
			_, err := lim.Allow(ctx, "acme")
			require.NoError(t, err)
		})...)
	}
	require.Equal(t, []string{
		"evalsha | 73f952be0b24e77426b2f840ebbe83f3b62f5614 | 1 | P:tenant:{acme}:submit | 1700000000000123 | 333333.3333333333 | 700",
		"evalsha | 73f952be0b24e77426b2f840ebbe83f3b62f5614 | 1 | P:tenant:{acme}:submit |  | 333333.3333333333 | 700",
	}, got)
}

// TestRateLimiter_AllowAllocs pins the allocations of Allow, which every submit makes, on Redis
// TIME as in production: it formatted the emission interval, and boxed it and the burst, at every
// call (12 allocations); they are formatted and boxed once, by NewRateLimiter.
func TestRateLimiter_AllowAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops go-redis's pooled buffers at random")
	}
	lim, err := tenant.NewRateLimiter(redistest.Client(t), &tenant.RateLimiterConfig{
		Rate: tenant.Rate{PerSecond: 1e6, Burst: 1000}, Prefix: redistest.Prefix(t),
	})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = lim.Allow(ctx, "acme") // the connection, and the script cached
	require.NoError(t, err)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := lim.Allow(ctx, "acme"); err != nil {
			panic(err)
		}
	})
	t.Logf("Allow: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 10.0)
}
