package executor_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// createJob commits a job of helloRequest for tenant on credential "default" at prio.
func createJob(t *testing.T, b *jobstest.Bundle, tenant string, prio jobs.Priority) *jobs.Job {
	t.Helper()
	return b.Create(t, jobstest.Opts{Tenant: tenant, Priority: prio, Request: helloRequest, Timeout: time.Hour})
}

// weightHold is a TenantWeight that records every tenant asked for and holds the asks of one
// tenant until release is closed (entered is closed at its first ask): a delivery held there
// keeps its place in the backlog gate, in its admission.
type weightHold struct {
	hold             string
	entered, release chan struct{}
	once             sync.Once
	mu               sync.Mutex
	asked            []string
}

// newWeightHold holds the weight asks of tenant hold.
func newWeightHold(hold string) *weightHold {
	return &weightHold{hold: hold, entered: make(chan struct{}), release: make(chan struct{})}
}

// weight is the executor.Config.TenantWeight.
func (w *weightHold) weight(ctx context.Context, tenant string) (int, error) {
	w.mu.Lock()
	w.asked = append(w.asked, tenant)
	w.mu.Unlock()
	if tenant == w.hold {
		w.once.Do(func() { close(w.entered) })
		select {
		case <-w.release:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return 1, nil
}

// askedFor reports whether tenant's weight was asked for.
func (w *weightHold) askedFor(tenant string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Contains(w.asked, tenant)
}

// TestExecutor_BacklogGateHoldsOnlyLowJobsSteps: with one place in the backlog gate, held by a
// low job's delivery (stuck in its admission), a normal job's delivery runs to the end, while a
// second low job's delivery waits for the place: as a task of the low queue (Delivery.Low)
// before it even reads the job, and as a task of the main queue after the read that tells it the
// job is low. When the place is free, it goes through.
func TestExecutor_BacklogGateHoldsOnlyLowJobsSteps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, _ := sharedAdmission(t, redistest.Client(t))
	p := simProvider(t, llmsim.Config{}, "sk-gate")
	w := newWeightHold("flood")
	reg := prometheus.NewRegistry()
	ex := executor.New(executor.Config{Store: b.Store, BacklogSteps: 1, Metrics: executor.NewMetrics(reg), Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: lim.Gate("sk-gate", "default"),
			Limit: limiter.Limit{Rate: 1000, Burst: 100}},
	}, TenantWeight: w.weight})

	holder := createJob(t, b, "flood", jobs.PriorityLow)
	held := make(chan error, 1)
	go func() { held <- ex.Process(ctx, dispatch.Delivery{JobID: holder.ID, Low: true}) }()
	select {
	case <-w.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first low delivery never reached its admission")
	}

	normal := createJob(t, b, "acme", jobs.PriorityNormal)
	nctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, ex.Process(nctx, dispatch.Delivery{JobID: normal.ID}), "a normal job does not wait for the gate")
	got, err := b.Store.Get(ctx, normal.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)

	late := createJob(t, b, "late", jobs.PriorityLow)
	loads := stageCounts(t, reg)[executor.StageLoad]
	for i, d := range []dispatch.Delivery{{JobID: late.ID, Low: true}, {JobID: late.ID}} {
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		err := ex.Process(wctx, d)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "delivery %+v waits for the gate's place", d)
		require.Equal(t, loads+uint64(i), stageCounts(t, reg)[executor.StageLoad], "only the main queue's delivery read the job")
	}
	require.False(t, w.askedFor("late"), "the waiting low job asked for no slot")
	got, err = b.Store.Get(ctx, late.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)

	close(w.release)
	select {
	case err := <-held:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the holder did not finish after its release")
	}
	require.NoError(t, ex.Process(nctx, dispatch.Delivery{JobID: late.ID, Low: true}))
	got, err = b.Store.Get(ctx, late.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
}

// TestExecutor_BacklogGateIsLeftForTheSlotsWait: a low job's delivery that sleeps until its
// slot (granted a few seconds ahead) does not keep its place in the gate meanwhile. With one
// place and 1 request per 3 s, of two low deliveries after the burst's, one sleeps about 3 s for
// its slot; the other must get in and be deferred (its slot about 6 s away, past MaxInlineWait,
// 3.5 s) before the sleeper ends. Were the place held through the sleep, the deferral would come
// after it. (Both would sleep only if the asks came more than 2.5 s after the burst's.)
func TestExecutor_BacklogGateIsLeftForTheSlotsWait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, _ := sharedAdmission(t, redistest.Client(t))
	p := simProvider(t, llmsim.Config{}, "sk-gate-wait")
	ex := executor.New(executor.Config{Store: b.Store, BacklogSteps: 1, MaxInlineWait: 3500 * time.Millisecond,
		Upstreams: map[string]executor.Upstream{
			"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: lim.Gate("sk-gate-wait", "default"),
				Limit: limiter.Limit{Rate: 1.0 / 3, Burst: 1}},
		}})
	first := createJob(t, b, "acme", jobs.PriorityLow)
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: first.ID, Low: true}), "the burst's slot")

	results := make(chan error, 2)
	for range 2 {
		job := createJob(t, b, "acme", jobs.PriorityLow)
		go func() { results <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID, Low: true}) }()
	}
	var got []error
	for range 2 {
		select {
		case err := <-results:
			got = append(got, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("deliveries did not end: %v so far", got)
		}
	}
	var df *dispatch.DeferError
	require.True(t, errors.As(got[0], &df), "the deferral ends first, during the other's sleep: %v", got)
	require.NoError(t, got[1], "the sleeper sends at its slot")
}

// TestExecutor_BacklogGateIsLeftForTheBreakersWait: a low job's delivery that waits inline on
// the circuit breaker (here its cold-start cap: one request out until the first answer) does
// not keep its place in the gate meanwhile. With one place: A's call is out (3 s), B is refused
// by the cap and waits for A's report; C must get in and read its job during B's wait. Were the
// place held through the wait, C would not be read before A's answer.
func TestExecutor_BacklogGateIsLeftForTheBreakersWait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, _ := sharedAdmission(t, rdb)
	brk, err := breaker.New(rdb, &breaker.Config{Prefix: redistest.Prefix(t) + "cap:", Threshold: 1})
	require.NoError(t, err)
	p := simProvider(t, llmsim.Config{Latency: 3 * time.Second}, "sk-gate-breaker")
	reg := prometheus.NewRegistry()
	ex := executor.New(executor.Config{Store: b.Store, BacklogSteps: 1, MaxInlineWait: 10 * time.Second, Metrics: executor.NewMetrics(reg),
		Upstreams: map[string]executor.Upstream{
			"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: lim.Gate("sk-gate-breaker", "default"),
				Circuit: brk.Circuit("sk-gate-breaker", "default"), Limit: limiter.Limit{Rate: 1000, Burst: 100}},
		}})
	loads := func() uint64 { return stageCounts(t, reg)[executor.StageLoad] }

	a, bj := createJob(t, b, "acme", jobs.PriorityLow), createJob(t, b, "acme", jobs.PriorityLow)
	results := make(chan error, 2)
	go func() { results <- ex.Process(ctx, dispatch.Delivery{JobID: a.ID, Low: true}) }()
	require.Eventually(t, func() bool {
		got, err := b.Store.Get(ctx, a.ID)
		return err == nil && got.Status == jobs.StatusRunning
	}, 30*time.Second, 5*time.Millisecond, "A's call goes out")
	go func() { results <- ex.Process(ctx, dispatch.Delivery{JobID: bj.ID, Low: true}) }()
	require.Eventually(t, func() bool { return loads() == 2 }, 30*time.Second, time.Millisecond, "B reads its job")

	c := createJob(t, b, "acme", jobs.PriorityLow)
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	err = ex.Process(cctx, dispatch.Delivery{JobID: c.ID, Low: true})
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "C waits on the cap too, A's call being out")
	require.Equal(t, uint64(3), loads(), "C got B's place during B's wait on the breaker")
	got, err := b.Store.Get(ctx, a.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusRunning, got.Status, "all of it happened while A's call was out")

	for range 2 {
		select {
		case err := <-results:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("A and B did not finish")
		}
	}
}

// TestExecutor_BacklogGateIsTakenAgainAfterTheBreakersWait: a low job's delivery that left its
// place to wait on the breaker takes a place again before its steps after the wait (its ask for a
// slot, a deferral's write): else every low delivery of a worker that waited on a breaker (up to
// worker.concurrency) asked and deferred at once when it closed, the flood the gate bounds. With
// one place: A's call is out (the cold-start cap's one request), B waits on the cap, and D, of
// another tenant, takes the place and holds it in its admission. When A's answer comes, B must
// not go on while D holds the place, and goes once D leaves it.
func TestExecutor_BacklogGateIsTakenAgainAfterTheBreakersWait(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	rdb := redistest.Client(t)
	lim, _ := sharedAdmission(t, rdb)
	brk, err := breaker.New(rdb, &breaker.Config{Prefix: redistest.Prefix(t) + "cap:", Threshold: 1})
	require.NoError(t, err)
	p := simProvider(t, llmsim.Config{Latency: time.Second}, "sk-gate-again")
	w := newWeightHold("holder")
	reg := prometheus.NewRegistry()
	ex := executor.New(executor.Config{Store: b.Store, BacklogSteps: 1, MaxInlineWait: 10 * time.Second, Metrics: executor.NewMetrics(reg),
		Upstreams: map[string]executor.Upstream{
			"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: lim.Gate("sk-gate-again", "default"),
				Circuit: brk.Circuit("sk-gate-again", "default"), Limit: limiter.Limit{Rate: 1000, Burst: 100}},
		},
		TenantWeight: w.weight})
	loads := func() uint64 { return stageCounts(t, reg)[executor.StageLoad] }
	status := func(id string) jobs.Status {
		got, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		return got.Status
	}

	a, bj := createJob(t, b, "acme", jobs.PriorityLow), createJob(t, b, "acme", jobs.PriorityLow)
	d := createJob(t, b, "holder", jobs.PriorityLow) // before A's call: its insert is not in the call's second
	results := make(chan error, 3)
	go func() { results <- ex.Process(ctx, dispatch.Delivery{JobID: a.ID, Low: true}) }()
	require.Eventually(t, func() bool { return status(a.ID) == jobs.StatusRunning }, 30*time.Second, 5*time.Millisecond, "A's call goes out")
	go func() { results <- ex.Process(ctx, dispatch.Delivery{JobID: bj.ID, Low: true}) }()
	require.Eventually(t, func() bool { return loads() == 2 }, 30*time.Second, time.Millisecond, "B reads its job")

	go func() { results <- ex.Process(ctx, dispatch.Delivery{JobID: d.ID, Low: true}) }()
	select {
	case <-w.entered: // D holds the place, B waits on the cap outside it
	case <-time.After(30 * time.Second):
		t.Fatal("D never got the place B left for its wait")
	}
	require.Equal(t, jobs.StatusRunning, status(a.ID), "all of it happened while A's call was out")

	select {
	case err := <-results:
		require.NoError(t, err, "A's delivery")
	case <-time.After(30 * time.Second):
		t.Fatal("A's call did not end")
	}
	require.Equal(t, jobs.StatusSucceeded, status(a.ID))
	// The breaker is warm now: B's wait ends within about a second (the time the cap told it to
	// wait, or the breaker's wake-up). Its steps after the wait need the place: B waits for it,
	// its job still queued.
	require.Eventually(t, func() bool { return executor.BacklogWaiters(ex) == 1 }, 30*time.Second, 5*time.Millisecond,
		"B waits for the gate's only place, which D holds, after its wait")
	require.Equal(t, jobs.StatusQueued, status(bj.ID), "B went on past its wait while D held the gate's only place")

	close(w.release)
	for range 2 {
		select {
		case err := <-results:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("B and D did not finish")
		}
	}
	require.Equal(t, jobs.StatusSucceeded, status(bj.ID))
	require.Equal(t, jobs.StatusSucceeded, status(d.ID))
}

// TestExecutor_BacklogGateIsTakenAgainAfterTheRetryDelay: a low job's delivery that sleeps out a
// short wait before its next attempt (a retry delay, a breaker's recheck: the time in its row)
// leaves its place for the sleep and takes one again before its admission. With one place: L
// sleeps, D of another tenant takes the place and holds it in its admission; L must not ask for
// its slot until D leaves it.
func TestExecutor_BacklogGateIsTakenAgainAfterTheRetryDelay(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, _ := sharedAdmission(t, redistest.Client(t))
	p := simProvider(t, llmsim.Config{}, "sk-gate-delay")
	w := newWeightHold("holder")
	reg := prometheus.NewRegistry()
	ex := executor.New(executor.Config{Store: b.Store, BacklogSteps: 1, MaxInlineWait: 10 * time.Second, Metrics: executor.NewMetrics(reg),
		Upstreams: map[string]executor.Upstream{
			"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: p, Gate: lim.Gate("sk-gate-delay", "default"),
				Limit: limiter.Limit{Rate: 1000, Burst: 100}},
		},
		TenantWeight: w.weight})

	l, d := createJob(t, b, "acme", jobs.PriorityLow), createJob(t, b, "holder", jobs.PriorityLow)
	require.NoError(t, b.Store.Postpone(ctx, l.ID, l.CredentialIndex, time.Now().Add(time.Second)))
	results := make(chan error, 2)
	go func() { results <- ex.Process(ctx, dispatch.Delivery{JobID: l.ID, Low: true}) }()
	require.Eventually(t, func() bool { return stageCounts(t, reg)[executor.StageLoad] == 1 }, 30*time.Second, time.Millisecond,
		"L reads its job")
	// D was created before L's delay began: only D's own steps up to its admission lie between
	// L's leaving the place for its sleep and the sleep's end.
	go func() { results <- ex.Process(ctx, dispatch.Delivery{JobID: d.ID, Low: true}) }()
	select {
	case <-w.entered: // D holds the place; L sleeps out its delay outside it
	case <-time.After(30 * time.Second):
		t.Fatal("D never got the place L left for its sleep")
	}
	require.Eventually(t, func() bool { return executor.BacklogWaiters(ex) == 1 }, 30*time.Second, 5*time.Millisecond,
		"L waits for the gate's only place, which D holds, after its delay")
	require.False(t, w.askedFor("acme"), "L asked for its slot after its delay while D held the gate's only place")

	close(w.release)
	for range 2 {
		select {
		case err := <-results:
			require.NoError(t, err)
		case <-time.After(20 * time.Second):
			t.Fatal("L and D did not finish")
		}
	}
	got, err := b.Store.Get(ctx, l.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
}
