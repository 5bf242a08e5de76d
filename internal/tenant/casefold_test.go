package tenant_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

// TestStore_CreateRefusesANameDifferingOnlyInCase: a tenant whose name differs from an existing
// one's only in case is refused (ErrExists, naming the existing tenant), revoked or not, also
// when both are created at once. Both were made: two tenants an operator cannot tell apart in
// dashboards and logs.
func TestStore_CreateRefusesANameDifferingOnlyInCase(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	ctx := t.Context()

	_, _, err := store.Create(ctx, "gamma", nil)
	require.NoError(t, err)
	for _, name := range []string{"Gamma", "GAMMA", "gamma"} {
		_, _, err = store.Create(ctx, name, nil)
		require.ErrorIs(t, err, tenant.ErrExists, name)
		require.ErrorContains(t, err, `"gamma"`, "names the tenant that exists")
	}
	_, err = store.Revoke(ctx, "gamma")
	require.NoError(t, err)
	_, _, err = store.Create(ctx, "GaMmA", nil)
	require.ErrorIs(t, err, tenant.ErrExists, "a revoked tenant keeps its name")

	t.Run("AtOnce", func(t *testing.T) {
		t.Parallel()
		for i := range 10 {
			names := []string{"Delta", "delta", "DELTA"}
			var wg sync.WaitGroup
			errs := make([]error, len(names))
			for j, name := range names {
				wg.Go(func() {
					_, _, errs[j] = store.Create(context.WithoutCancel(ctx), name+string(rune('a'+i)), nil)
				})
			}
			wg.Wait()
			made := 0
			for _, err := range errs {
				if err == nil {
					made++
					continue
				}
				require.ErrorIs(t, err, tenant.ErrExists)
			}
			require.Equal(t, 1, made, "round %d: %v", i, errs)
		}
	})
}
