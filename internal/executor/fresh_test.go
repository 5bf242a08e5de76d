package executor_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// freshJob commits a job of helloRequest on credential "default" and returns it as a Handoff
// gets it: the job Create returned (with the request it was created with).
func freshJob(t *testing.T, b *jobstest.Bundle) *jobs.Job {
	t.Helper()
	job, _, err := b.Store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	return job
}

// freshSetup returns a job store and an executor with one credential, "default", on a simulator
// answering key, and the credential's gate; the executor's metrics go to reg.
func freshSetup(t *testing.T, key string, reg *prometheus.Registry) (*jobstest.Bundle, *executor.Executor, *limiter.Gate) {
	t.Helper()
	return freshSetupLimited(t, key, reg, limiter.Limit{}, 0)
}

// freshSetupLimited is freshSetup with the credential's request limit (zero: learned) and the
// executor's MaxInlineWait (zero: its default).
func freshSetupLimited(t *testing.T, key string, reg *prometheus.Registry, limit limiter.Limit,
	maxInlineWait time.Duration) (*jobstest.Bundle, *executor.Executor, *limiter.Gate) {
	t.Helper()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	gate := lim.Gate(key, "default")
	est, err := estimator.New(nil)
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store, Metrics: executor.NewMetrics(reg), MaxInlineWait: maxInlineWait, Estimator: est,
		Upstreams: map[string]executor.Upstream{
			"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: simProvider(t, llmsim.Config{}, key),
				Gate: gate, Circuit: brk.Circuit(key, "default"), Limit: limit},
		}})
	return b, ex, gate
}

// A handed-over first delivery (ProcessFresh) runs the job from the row its creator holds: it
// stores the answer without reading the job first, and records its pick-up once.
func TestExecutor_ProcessFreshRunsWithoutReadingTheJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	b, ex, _ := freshSetup(t, "sk-fresh", reg)
	job := freshJob(t, b)

	require.NoError(t, ex.ProcessFresh(ctx, job, nil))

	succeededOnce(t, b, job.ID)
	stages := stageCounts(t, reg)
	require.Zero(t, stages[executor.StageLoad], "the job was not read")
	require.Equal(t, uint64(1), stages[executor.StagePickup])
	require.Equal(t, uint64(1), stages[executor.StageCall])
}

// A handed-over delivery that must wait answers as a task's would: a *dispatch.DeferError, with
// the time written in the job row for the task that comes back.
func TestExecutor_ProcessFreshDefersLikeAProcess(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, ex, gate := freshSetup(t, "sk-fresh-paused", prometheus.NewRegistry())
	_, err := gate.Pause(ctx, "spend_cap", "")
	require.NoError(t, err)
	job := freshJob(t, b)

	err = ex.ProcessFresh(ctx, job, nil)

	var d *dispatch.DeferError
	require.ErrorAs(t, err, &d)
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)
	require.Zero(t, got.Attempts)
	require.NotNil(t, got.NextAttemptAt, "the deferral's time is in the row")
	// The row holds the slot on the limiter's clock (Redis's), the deferral on this process's:
	// here one clock, read a round trip apart.
	require.WithinDuration(t, d.Until, *got.NextAttemptAt, 100*time.Millisecond)
}

// A job canceled between its commit and its handed-over delivery is not sent: the attempt's
// start is conditional on the row, which the delivery did not read.
func TestExecutor_ProcessFreshSkipsACanceledJob(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	b, ex, _ := freshSetup(t, "sk-fresh-cancel", reg)
	job := freshJob(t, b)
	_, err := b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)

	require.NoError(t, ex.ProcessFresh(ctx, job, nil))

	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Zero(t, got.Attempts)
	require.Zero(t, stageCounts(t, reg)[executor.StageCall], "the provider was not called")
}

// newParams is a new job of helloRequest on credential "default", at priority p.
func newParams(p jobs.Priority) jobs.CreateParams {
	return jobs.CreateParams{Tenant: "default", Credential: "default", Request: helloRequest, MaxAttempts: 3,
		Timeout: time.Minute, Priority: p}
}

// succeededOnce requires job id succeeded in one attempt with a result, and returns it.
func succeededOnce(t *testing.T, b *jobstest.Bundle, id string) *jobs.Job {
	t.Helper()
	got, err := b.Store.Get(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, 1, got.Attempts)
	require.NotEmpty(t, got.Result)
	return got
}

// warm runs one job through a handed-over delivery that asks for its admission itself, so that
// the credential's breaker has a success recorded: a cold breaker (none within its memory)
// admits only its own probes, and the reservation's test of it declines.
func warm(t *testing.T, b *jobstest.Bundle, ex *executor.Executor) {
	t.Helper()
	job := freshJob(t, b)
	require.NoError(t, ex.ProcessFresh(t.Context(), job, nil))
	got, err := b.Store.Get(t.Context(), job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
}

// A first attempt admitted before its job exists (AdmitFirst) with its slot due at once starts
// with the job's insert: the job is created running, and its handed-over delivery calls the
// provider without a statement of its own before the call (no begin stage), storing one
// attempt and the answer.
func TestExecutor_AdmitFirstStartsTheAttemptWithTheInsert(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	b, ex, _ := freshSetup(t, "sk-first", reg)
	warm(t, b, ex)
	before := stageCounts(t, reg)
	p := newParams(jobs.PriorityNormal)
	prepared, err := b.Store.Prepare(&p)
	require.NoError(t, err)

	adm := ex.AdmitFirst(ctx, prepared)
	require.NotNil(t, adm)
	require.NotNil(t, adm.Begin(), "the slot is due at once")
	p.Admit = func(context.Context, *jobs.Job) *jobs.Begin { return adm.Begin() }
	job, _, err := b.Store.Create(ctx, p)
	require.NoError(t, err)
	require.Equal(t, prepared.ID, job.ID)
	require.Equal(t, jobs.StatusRunning, job.Status)
	require.NoError(t, ex.ProcessFresh(ctx, job, adm))

	got := succeededOnce(t, b, job.ID)
	require.Nil(t, got.LeaseToken, "the attempt's lease is released")
	attempts, err := b.Store.Attempts(ctx, job.ID)
	require.NoError(t, err)
	require.Len(t, attempts, 1)
	stages := stageCounts(t, reg)
	require.Equal(t, before[executor.StageBegin], stages[executor.StageBegin], "no statement of its own started the attempt")
	require.Equal(t, before[executor.StageAdmit]+1, stages[executor.StageAdmit])
	require.Equal(t, before[executor.StageCall]+1, stages[executor.StageCall])
}

// AdmitFirst takes no admission, leaving the delivery to ask as any other, where its one ask
// cannot admit the attempt outright: a low job, a job past its deadline, a credential not
// configured, a paused credential.
func TestExecutor_AdmitFirstDeclines(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, ex, gate := freshSetup(t, "sk-first-declines", prometheus.NewRegistry())
	cold := newParams(jobs.PriorityNormal)
	coldJob, err := b.Store.Prepare(&cold)
	require.NoError(t, err)
	require.Nil(t, ex.AdmitFirst(ctx, coldJob), "a cold breaker: its own probe decides")
	warm(t, b, ex)
	prepare := func(p jobs.CreateParams) *jobs.Job {
		t.Helper()
		job, err := b.Store.Prepare(&p)
		require.NoError(t, err)
		return job
	}

	require.NotNil(t, ex.AdmitFirst(ctx, prepare(newParams(jobs.PriorityNormal))), "the control: admitted")
	require.Nil(t, ex.AdmitFirst(ctx, prepare(newParams(jobs.PriorityLow))), "a low job")
	late := newParams(jobs.PriorityNormal)
	late.Timeout = -time.Second
	require.Nil(t, ex.AdmitFirst(ctx, prepare(late)), "past its deadline")
	other := newParams(jobs.PriorityNormal)
	other.Credential = "other"
	require.Nil(t, ex.AdmitFirst(ctx, prepare(other)), "a credential not configured")
	_, err = gate.Pause(ctx, "spend_cap", "")
	require.NoError(t, err)
	require.Nil(t, ex.AdmitFirst(ctx, prepare(newParams(jobs.PriorityNormal))), "a paused credential")
}

// A first attempt admitted with its slot further out than a delivery sleeps creates the job
// queued; its handed-over delivery holds the slot in the row and defers to the slot's time,
// without reserving again or counting an attempt.
func TestExecutor_AdmitFirstForALaterSlotHoldsIt(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	// One request a minute: the second slot is a minute after the first.
	b, ex, _ := freshSetupLimited(t, "sk-first-later", prometheus.NewRegistry(), limiter.Limit{Rate: 1.0 / 60, Burst: 1}, 10*time.Millisecond)
	start := time.Now()
	warm(t, b, ex) // takes the burst's slot
	warmed := time.Now()

	job, adm := admittedForALaterSlot(t, b, ex, 10*time.Minute) // the slot comes before the deadline
	require.Equal(t, jobs.StatusQueued, job.Status)

	err := ex.ProcessFresh(ctx, job, adm)
	var d *dispatch.DeferError
	require.ErrorAs(t, err, &d)
	// A minute after the burst's slot, taken while warm ran: counted from the test's clock at
	// the check, the margin was what the test took since, which a loaded run can spend.
	require.WithinRange(t, d.Until, start.Add(time.Minute-time.Second), warmed.Add(time.Minute+time.Second))
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)
	require.Zero(t, got.Attempts)
	require.NotNil(t, got.SlotSeq, "the slot is held in the row for the delivery that comes back")
	require.NotNil(t, got.NextAttemptAt)
	// The row holds the slot on the limiter's clock (Redis's), the deferral on this process's:
	// here one clock, read a round trip apart.
	require.WithinDuration(t, d.Until, *got.NextAttemptAt, 100*time.Millisecond)
}

// A handed-over first delivery whose later slot the row refuses because another delivery's
// attempt holds the job (a task the sweeper enqueued while this delivery stalled, say) is
// deferred as a leased job's delivery is, not ended as done: its job is not left to the sweeper.
func TestExecutor_AdmitFirstSlotRefusedForALeasedJobDefers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, ex, _ := freshSetupLimited(t, "sk-first-leased", prometheus.NewRegistry(), limiter.Limit{Rate: 1.0 / 60, Burst: 1}, 10*time.Millisecond)
	warm(t, b, ex) // takes the burst's slot

	job, adm := admittedForALaterSlot(t, b, ex, 10*time.Minute)
	_, err := b.Store.BeginAttempt(ctx, job.ID) // another delivery's attempt
	require.NoError(t, err)

	err = ex.ProcessFresh(ctx, job, adm)
	var d *dispatch.DeferError
	require.ErrorAs(t, err, &d, "the leased job's delivery ended as done")
	require.Equal(t, "another delivery's attempt holds the job", d.Reason)
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusRunning, got.Status)
	require.Nil(t, got.SlotSeq)
}

// Under fair queueing, AdmitFirst admits only with the tenant's weight at hand
// (Config.CachedTenantWeight): it runs inside the job's insert transaction and must not wait for
// a Postgres read of the weight, for which the pool's other connections, held by other inserts
// in the same wait, may never come free.
func TestExecutor_AdmitFirstNeedsTheWeightAtHand(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	var cached atomic.Bool
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: simProvider(t, llmsim.Config{}, "sk-first-weight"),
			Gate: lim.Gate("sk-first-weight", "default"), Circuit: brk.Circuit("sk-first-weight", "default")},
	},
		TenantWeight: func(context.Context, string) (int, error) { return 1, nil },
		CachedTenantWeight: func(string) (int, bool) {
			return 1, cached.Load()
		}})
	warm(t, b, ex)
	admit := func() dispatch.Admission {
		t.Helper()
		p := newParams(jobs.PriorityNormal)
		job, err := b.Store.Prepare(&p)
		require.NoError(t, err)
		return ex.AdmitFirst(ctx, job)
	}

	require.Nil(t, admit(), "no weight at hand")
	cached.Store(true)
	adm := admit()
	require.NotNil(t, adm, "the weight at hand")
	require.NotNil(t, adm.Begin())
}

// AdmitFirst does not wait on a Redis that does not answer: past its bound it admits nothing,
// and the job is created without an admission (a submit, and the keyed insert's transaction
// around it, are not held).
func TestExecutor_AdmitFirstDoesNotWaitOnASilentRedis(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ln.Close()) })
	var held []net.Conn // accepted and never answered
	var mu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	})
	silent := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1})
	t.Cleanup(func() { _ = silent.Close() })
	lim, brk := sharedAdmission(t, silent)
	b := jobstest.New(t)
	ex := executor.New(executor.Config{Store: b.Store, Upstreams: map[string]executor.Upstream{
		"default": {Name: "default", Kind: string(llm.KindAnthropic), Provider: simProvider(t, llmsim.Config{}, "sk-silent"),
			Gate: lim.Gate("sk-silent", "default"), Circuit: brk.Circuit("sk-silent", "default")},
	}})
	p := newParams(jobs.PriorityNormal)
	job, err := b.Store.Prepare(&p)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan dispatch.Admission, 1)
	go func() { done <- ex.AdmitFirst(ctx, job) }()
	select {
	case adm := <-done:
		require.Nil(t, adm)
	case <-time.After(5 * time.Second):
		t.Fatal("AdmitFirst waited on a Redis that does not answer")
	}
}

// A first admission whose slot comes at or after the job's deadline fails the job at once,
// deadline_exceeded and unsent, as a delivery's own admission does (TestExecutor_SlotAfterThe
// DeadlineFailsAtOnce); it was held in the row (or slept out) and the job waited, or was sent,
// past its deadline.
func TestExecutor_AdmitFirstSlotAfterTheDeadlineFailsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	b, ex, _ := freshSetupLimited(t, "sk-first-deadline", reg, limiter.Limit{Rate: 1.0 / 60, Burst: 1}, 10*time.Millisecond)
	warm(t, b, ex) // takes the burst's slot: the next is a minute out
	calls := stageCounts(t, reg)[executor.StageCall]

	job, adm := admittedForALaterSlot(t, b, ex, 30*time.Second) // the deadline comes first

	require.NoError(t, ex.ProcessFresh(ctx, job, adm))
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusFailed, got.Status)
	require.Equal(t, jobs.ReasonDeadlineExceeded, got.LastError.Class)
	require.Zero(t, got.Attempts, "nothing was started")
	require.Equal(t, calls, stageCounts(t, reg)[executor.StageCall], "the provider was not called")
}

// A first admission given back (its job was not created: Claim.Drop) hands on the probe of a
// limit being learned, as a delivery's unsent probe does: the credential's other attempts do not
// wait out the probe's hold.
func TestExecutor_ReleasedFirstAdmissionHandsTheProbeOn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	gate := lim.Gate("sk-first-probe", "default")
	circuit := brk.Circuit("sk-first-probe", "default")
	a, err := circuit.Allow(ctx) // a warm breaker: a cold one declines AdmitFirst
	require.NoError(t, err)
	_, err = circuit.Report(ctx, a, breaker.Success)
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store,
		Upstreams: map[string]executor.Upstream{"default": {Name: "default", Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-first-probe"), Gate: gate, Circuit: circuit}}}) // the limit is learned

	p := newParams(jobs.PriorityNormal)
	prepared, err := b.Store.Prepare(&p)
	require.NoError(t, err)
	adm := ex.AdmitFirst(ctx, prepared)
	require.NotNil(t, adm, "the limit's probe is granted at once")

	adm.Release(ctx)

	r, err := gate.Reserve(ctx, limiter.Limit{})
	require.NoError(t, err)
	require.True(t, r.Granted && r.Probe, "the next attempt is the probe: %+v", r)
}

// admittedForALaterSlot creates a job with the given timeout whose first attempt AdmitFirst
// admitted for a slot a minute out (the credential's one-a-minute burst taken by warm): the
// insert does not start it, and the job is created queued.
func admittedForALaterSlot(t *testing.T, b *jobstest.Bundle, ex *executor.Executor, timeout time.Duration) (*jobs.Job, dispatch.Admission) {
	t.Helper()
	p := newParams(jobs.PriorityNormal)
	p.Timeout = timeout
	prepared, err := b.Store.Prepare(&p)
	require.NoError(t, err)
	adm := ex.AdmitFirst(t.Context(), prepared)
	require.NotNil(t, adm, "a slot a minute out is granted")
	require.Nil(t, adm.Begin(), "not due (or past the deadline): the insert starts no attempt")
	job, _, err := b.Store.Create(t.Context(), p)
	require.NoError(t, err)
	return job, adm
}
