package executor

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/retrypolicy"
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
// bound (DefaultRecordRetryWindow, record's own) and nothing more. end made a bound of its own, the same
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
		rctx, cancel := context.WithTimeout(ctx, DefaultRecordRetryWindow)
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

// TestKeepLease_Allocs pins the allocations of an attempt's lease kept through a call that ends
// before its first renewal, as most do: the keeper, its renewal's timer and the timer's func.
// Its lock, wait group and timer as variables of their own, the renewal's and stop's closures
// and the renewals' context made at once were 7 at every attempt, and attempt's closure around
// its abort one more.
func TestKeepLease_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	token := "0195f4c2-7b1e-7000-8000-0000000000aa"
	job := &jobs.Job{ID: "0195f4c2-7b1e-7000-8000-000000000001", LeaseToken: &token}
	e := New(Config{Store: jobs.NewStore(pgtest.Pool(t), nil)})
	ctx := context.Background()
	allocs := testing.AllocsPerRun(200, func() {
		e.keepLease(ctx, job, nil).stop()
	})
	t.Logf("keepLease: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 3.0, "allocations per lease kept")
}

// TestCall_Allocs pins the allocations of an answered call (call, then its bookkeeping,
// with neither limiter nor breaker) beside its provider's Send alone under a bound of its own,
// as call bounds it: the attempt's record, its bookkeeping's state in one allocation and the
// bookkeeping's context without the delivery's cancellation (3). The bookkeeping's closure and
// the stream's headers' answer it shared with the stream's callback were 2 (4 in all).
func TestCall_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("allocations are counted without the race detector")
	}
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	t.Cleanup(sim.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: sim.URL, APIKey: "sk-call"})
	require.NoError(t, err)
	up := Upstream{Name: "sim", Kind: string(llm.KindAnthropic), Provider: p, AttemptTimeout: time.Minute}
	e := New(Config{Store: jobs.NewStore(pgtest.Pool(t), nil)})
	token := "0195f4c2-7b1e-7000-8000-0000000000aa"
	job := &jobs.Job{ID: "0195f4c2-7b1e-7000-8000-000000000001", Tenant: "default", Attempts: 1,
		Deadline: time.Now().Add(time.Hour), LeaseToken: &token,
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`)}
	ctx := context.Background()
	send := func() {
		sctx, cancel := context.WithTimeout(ctx, up.AttemptTimeout)
		defer cancel()
		resp, err := p.Send(sctx, job.Request, llm.SendOptions{})
		if err != nil {
			panic(err)
		}
		resp.Release()
	}
	send() // a connection made, and idle
	floor := testing.AllocsPerRun(200, send)
	allocs := testing.AllocsPerRun(200, func() {
		r := e.call(ctx, job, up, admission{})
		if r.err != nil {
			panic(r.err)
		}
		r.book.run()
		r.resp.Release()
	})
	t.Logf("call: %.1f allocations, its provider's Send %.1f", allocs, floor)
	require.LessOrEqual(t, allocs, floor+3, "allocations per call beyond its Send")
}

// TestOutcome_Allocs pins the allocations of a delivery's answer (Process of a task whose
// job does not exist, and outcome of a delivery that needs nothing more): none beyond the
// dropped task's warning. The targets of errors.As (a *dispatch.DeferError's and a *deferral's
// pointer) moved to the heap, one each at every delivery.
func TestOutcome_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	e := New(Config{Store: jobs.NewStore(pgtest.Pool(t), nil)})
	ctx := context.Background()
	const id = "0195f4c2-7b1e-7000-8000-000000000001"
	outcome := testing.AllocsPerRun(200, func() {
		if err := e.outcome(ctx, id, nil); err != nil {
			panic(err)
		}
	})
	// The floor: load's warning of a task without a job, as load logs it (its ID not a
	// constant, whose boxing would be free).
	d := dispatch.Delivery{JobID: string([]byte("not-a-job"))}
	floor := testing.AllocsPerRun(200, func() {
		e.cfg.Logger.WarnContext(ctx, "task for a job that does not exist; dropping it", "job_id", d.JobID)
	})
	process := testing.AllocsPerRun(200, func() {
		if err := e.Process(ctx, d); err != nil {
			panic(err)
		}
	})
	t.Logf("outcome: %.1f allocations; Process of a task without a job %.1f, its warning %.1f", outcome, process, floor)
	require.Zero(t, outcome, "allocations per outcome")
	require.LessOrEqual(t, process, floor, "allocations per Process of a task without a job beyond its warning")
}

// TestObservation_Allocs pins the allocations of what an answer tells the limiter (observation,
// in every answer's bookkeeping): none. errors.As's target (a *llm.StatusError's pointer) moved
// to the heap, 1 at every call.
func TestObservation_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	now := time.Now()
	resp := &llm.Response{StatusCode: 200, RateLimit: llm.RateLimit{Known: true, Limit: 50, Remaining: 49}}
	var o limiter.Observation
	allocs := testing.AllocsPerRun(200, func() {
		o = observation(Upstream{Name: "sim"}, admission{seq: 1}, resp, nil, retrypolicy.Decision{}, now, now)
	})
	require.Equal(t, 200, o.StatusCode)
	require.True(t, o.HeadersKnown)
	t.Logf("observation: %.1f allocations", allocs)
	require.Zero(t, allocs, "allocations per observation")
}
