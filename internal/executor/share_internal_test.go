package executor

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

// TestExecutor_ShareAllocs: a delivery's slot in its tenant's share (Config.Slots), its weight
// cached, is taken and given back without an allocation; so is a deferral's decision.
func TestExecutor_ShareAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	pool := pgtest.Pool(t)
	weights := tenant.NewWeights(tenant.NewStore(pool, nil), nil)
	e := New(Config{Store: jobs.NewStore(pool, nil), TenantWeight: weights.Weight, CachedTenantWeight: weights.Cached,
		Slots: 2, SingleTenant: weights.Single})
	job := &jobs.Job{ID: "0195f4c2-7b1e-7000-8000-000000000001", Tenant: "default", Deadline: time.Now().Add(time.Hour)}
	ctx := t.Context()
	took, err := e.takeShare(ctx, job) // the weight read, and cached
	require.NoError(t, err)
	require.True(t, took)
	e.shares.Release(job.Tenant)
	require.True(t, weights.Single())
	allocs := testing.AllocsPerRun(200, func() {
		if took, err := e.takeShare(ctx, job); err != nil || !took {
			panic(fmt.Sprint("no slot: ", err))
		}
		e.shares.Release(job.Tenant)
	})
	require.Zero(t, allocs, "allocations per slot taken and given back")
}
