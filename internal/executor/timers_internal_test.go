package executor

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

// TestExecutor_LaneAllocs pins the allocations of a delivery's lane when its tenant's weight is
// cached, as it is for all but the first delivery of a tenant in WeightCacheTTL: the lane itself.
// A bound on the weight's read (Config.StoreTimeout) was made at every delivery, its timer, its
// context and its cancel (5 allocations), for a read that waits for nothing; it is made only when
// the weight is read from Postgres.
func TestExecutor_LaneAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	pool := pgtest.Pool(t)
	weights := tenant.NewWeights(tenant.NewStore(pool, nil), nil)
	e := New(Config{Store: jobs.NewStore(pool, nil), TenantWeight: weights.Weight, CachedTenantWeight: weights.Cached})
	job := &jobs.Job{ID: "0195f4c2-7b1e-7000-8000-000000000001", Tenant: "default"}
	lane, err := e.lane(t.Context(), job) // the weight read, and cached
	require.NoError(t, err)
	require.Equal(t, tenant.DefaultWeight, lane.Weight)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := e.lane(ctx, job); err != nil {
			panic(err)
		}
	})
	t.Logf("lane: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 1.0, "allocations per lane of a cached weight")
}

// TestExecutor_EndAllocs pins the allocations of the record of a job's end (end, then record's
// store call) against the same work with the store call's context made by hand: the end's one
// bound (recordRetryWindow, record's own) and nothing more. end made a bound of its own, the same
// 30 s, around record's: two contexts where one does (record's then degraded to a cancel-only
// child, its parent's deadline being the sooner), 5 more allocations at every job's end.
func TestExecutor_EndAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pgx's pooled buffers at random")
	}
	ctx := context.Background()
	store := jobs.NewStore(pgtest.Pool(t), nil)
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "c",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	job, err = store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	e := New(Config{Store: store})
	a := &jobs.Attempt{Number: 1, Credential: "c", LeaseToken: *job.LeaseToken}
	o := jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)}
	require.ErrorIs(t, e.end(ctx, job, a, o), errHandled) // stored; every end after answers applied=false
	// The floor: record's store call with one bound of its own, as record makes it.
	floor := testing.AllocsPerRun(200, func() {
		rctx, cancel := context.WithTimeout(ctx, recordRetryWindow)
		_, err := store.Finish(rctx, job.ID, a, o)
		cancel()
		if err != nil {
			panic(err)
		}
	})
	allocs := testing.AllocsPerRun(200, func() {
		if err := e.end(ctx, job, a, o); err != errHandled {
			panic(err)
		}
	})
	t.Logf("end: %.1f allocations, its store call with one bound %.1f", allocs, floor)
	// The one more is end's own: the write's context without the delivery's cancellation.
	require.LessOrEqual(t, allocs, floor+1, "allocations per end beyond its store call")
}
