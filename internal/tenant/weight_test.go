package tenant_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

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
