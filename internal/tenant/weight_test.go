package tenant_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

func TestStore_Weight(t *testing.T) {
	t.Parallel()
	store := tenant.NewStore(pgtest.Pool(t), nil)
	ctx := context.Background()

	plain, _, err := store.Create(ctx, "plain", nil)
	require.NoError(t, err)
	require.Equal(t, tenant.DefaultWeight, plain.Weight)
	heavy, _, err := store.CreateWeighted(ctx, "heavy", nil, 3)
	require.NoError(t, err)
	require.Equal(t, 3, heavy.Weight)

	w, err := store.Weight(ctx, "heavy")
	require.NoError(t, err)
	require.Equal(t, 3, w)
	w, err = store.Weight(ctx, tenant.Default) // the anonymous tenant has no row
	require.NoError(t, err)
	require.Equal(t, tenant.DefaultWeight, w)

	require.NoError(t, store.SetWeight(ctx, "plain", 7))
	list, err := store.List(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, list[0].Weight)
	require.Equal(t, 7, list[1].Weight)

	for _, bad := range []int{0, -1, tenant.MaxWeight + 1} {
		require.ErrorIs(t, store.SetWeight(ctx, "plain", bad), tenant.ErrInvalidWeight)
		_, _, err := store.CreateWeighted(ctx, "other", nil, bad)
		require.ErrorIs(t, err, tenant.ErrInvalidWeight)
	}
	require.ErrorIs(t, store.SetWeight(ctx, "nobody", 2), tenant.ErrNotFound)
	w, err = store.Weight(ctx, "plain")
	require.NoError(t, err)
	require.Equal(t, 7, w, "a refused change leaves the weight")
}

func TestWeights_Cached(t *testing.T) {
	t.Parallel()
	store := tenant.NewStore(pgtest.Pool(t), nil)
	ctx := context.Background()
	clock := clocktest.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	_, _, err := store.CreateWeighted(ctx, "acme", nil, 2)
	require.NoError(t, err)
	c := tenant.NewWeights(store, clock.Now)

	_, ok := c.Cached("acme")
	require.False(t, ok, "Cached does not read the store")
	w, err := c.Weight(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, 2, w)
	require.NoError(t, store.SetWeight(ctx, "acme", 5))
	w, _ = c.Weight(ctx, "acme")
	require.Equal(t, 2, w, "kept for the cache's TTL")
	w, ok = c.Cached("acme")
	require.True(t, ok)
	require.Equal(t, 2, w)
	clock.Advance(tenant.WeightCacheTTL)
	_, ok = c.Cached("acme")
	require.False(t, ok, "stale: Cached has nothing at hand")
	w, _ = c.Weight(ctx, "acme")
	require.Equal(t, 5, w, "read again once stale")
	w, _ = c.Weight(ctx, tenant.Default)
	require.Equal(t, tenant.DefaultWeight, w)
}

// Single is what the last read of a weight found: no tenant stored but Default (revoked ones
// aside) is a single tenant; any other is several. Nothing read yet: not single.
func TestWeights_Single(t *testing.T) {
	t.Parallel()
	store := tenant.NewStore(pgtest.Pool(t), nil)
	ctx := context.Background()
	clock := clocktest.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	c := tenant.NewWeights(store, clock.Now)
	require.False(t, c.Single(), "nothing read yet")
	_, err := c.Weight(ctx, tenant.Default)
	require.NoError(t, err)
	require.True(t, c.Single(), "no tenant stored: anonymous requests only")

	_, _, err = store.Create(ctx, tenant.Default, nil)
	require.NoError(t, err)
	clock.Advance(tenant.WeightCacheTTL)
	_, err = c.Weight(ctx, tenant.Default)
	require.NoError(t, err)
	require.True(t, c.Single(), "Default stored")

	_, _, err = store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	_, _ = c.Cached(tenant.Default)
	require.True(t, c.Single(), "a cached weight reads nothing")
	clock.Advance(tenant.WeightCacheTTL)
	_, err = c.Weight(ctx, tenant.Default)
	require.NoError(t, err)
	require.False(t, c.Single(), "another tenant stored")

	_, err = store.Revoke(ctx, "acme")
	require.NoError(t, err)
	w, err := c.Weight(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, tenant.DefaultWeight, w)
	require.True(t, c.Single(), "revoked")
}
