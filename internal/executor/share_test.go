package executor_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// heldProvider returns a provider on llmsim whose first call is held until release is closed
// (or the test ends), and a channel closed once that call arrived.
func heldProvider(t *testing.T) (p llm.Provider, arrived <-chan struct{}, release chan struct{}) {
	t.Helper()
	sim := llmsim.New(llmsim.Config{})
	first, in, out := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	first <- struct{}{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-first:
			close(in)
			select {
			case <-out:
			case <-r.Context().Done():
			}
		default:
		}
		sim.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-out:
		default:
			close(out)
		}
	})
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-share"})
	require.NoError(t, err)
	return p, in, out
}

// With Config.Slots, a tenant alone holds every slot but the reserve (of 2 slots: one): while
// its first call is in flight, its next delivery is deferred before the limiter and the attempt,
// with its reason and counted by tenant; once the call ended, its slot is back and the next
// delivery runs. In a deployment of a single tenant, the reserve costs nothing: both run.
func TestExecutor_TenantShareOfSlots(t *testing.T) {
	t.Parallel()
	for _, single := range []bool{false, true} {
		t.Run(map[bool]string{false: "SeveralTenants", true: "SingleTenant"}[single], func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			p, arrived, release := heldProvider(t)
			reg := prometheus.NewRegistry()
			ex := executor.New(executor.Config{Store: b.Store, Metrics: executor.NewMetrics(reg),
				Upstreams: map[string]executor.Upstream{"sim": {Name: "sim", Kind: string(llm.KindAnthropic), Provider: p}},
				Slots:     2, SingleTenant: func() bool { return single }})
			create := func() *jobs.Job {
				job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "acme", Credential: "sim",
					Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
				require.NoError(t, err)
				return job
			}
			first, second := create(), create()
			done := make(chan error, 1)
			go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: first.ID}) }()
			select {
			case <-arrived:
			case <-time.After(10 * time.Second):
				t.Fatal("the first call never reached the provider")
			}

			perr := ex.Process(ctx, dispatch.Delivery{JobID: second.ID})
			got, err := b.Store.Get(ctx, second.ID)
			require.NoError(t, err)
			if single {
				require.NoError(t, perr, "a single tenant takes every slot")
				require.Equal(t, jobs.StatusSucceeded, got.Status)
			} else {
				var df *dispatch.DeferError
				require.ErrorAs(t, perr, &df)
				require.Contains(t, df.Reason, "share of this worker's delivery slots")
				require.Less(t, time.Until(df.Until), 2*time.Second, "a short delay")
				require.Zero(t, got.Attempts, "no attempt counted")
				require.Nil(t, got.SlotSeq)
				require.NotNil(t, got.NextAttemptAt)
				require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(shareDeferralsOfAcme),
					"llmq_delivery_share_deferrals_total"))
			}

			close(release)
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the held call never ended")
			}
			if !single {
				// The slot came back with the first delivery's end.
				// (Delivered here before its time, which asynq would not do, it sleeps out the
				// job's short delay, as for any deferral.)
				dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				require.NoError(t, ex.Process(dctx, dispatch.Delivery{JobID: second.ID}))
				got, err := b.Store.Get(ctx, second.ID)
				require.NoError(t, err)
				require.Equal(t, jobs.StatusSucceeded, got.Status)
			}
		})
	}
}

const shareDeferralsOfAcme = `# HELP llmq_delivery_share_deferrals_total Deliveries deferred because their tenant held its share of the worker's delivery slots, by tenant.
# TYPE llmq_delivery_share_deferrals_total counter
llmq_delivery_share_deferrals_total{tenant="acme"} 1
`

// shareExecutor returns an executor of 2 delivery slots (a reserve of one) in a deployment of
// several tenants, whose credential "sim" is p; "gone" is not configured.
func shareExecutor(b *jobstest.Bundle, p llm.Provider) *executor.Executor {
	return executor.New(executor.Config{Store: b.Store,
		Upstreams: map[string]executor.Upstream{"sim": {Name: "sim", Kind: string(llm.KindAnthropic), Provider: p}},
		Slots:     2})
}

// acmeJob commits a job of tenant acme of helloRequest on credential (then fallbacks), of timeout.
func acmeJob(t *testing.T, b *jobstest.Bundle, credential string, timeout time.Duration, fallbacks ...string) *jobs.Job {
	t.Helper()
	job, _, err := b.Store.Create(t.Context(), jobs.CreateParams{Tenant: "acme", Credential: credential,
		Fallbacks: fallbacks, Request: helloRequest, MaxAttempts: 3, Timeout: timeout})
	require.NoError(t, err)
	return job
}

// awaitCall waits for the held call to reach the provider; a delivery that ends first fails
// the test with its error.
func awaitCall(t *testing.T, arrived <-chan struct{}, done <-chan error) {
	t.Helper()
	select {
	case <-arrived:
	case err := <-done:
		t.Fatalf("the delivery ended before its call: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the call never reached the provider")
	}
}

// awaitDone waits for a delivery's end, which must be nil.
func awaitDone(t *testing.T, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the held call never ended")
	}
}

// A delivery that fails its job over runs it on the fallback in the slot it holds: the nested
// delivery takes no second slot of the tenant's share (it was turned away by the first, the job
// deferred for its own slot). A serve process's own first delivery holds a slot of its own, not
// one of asynq's: failed over, it takes none of the share either, though the tenant holds its
// share already.
func TestExecutor_FailOverTakesNoSecondSlot(t *testing.T) {
	t.Parallel()
	for _, fresh := range []bool{false, true} {
		t.Run(map[bool]string{false: "Process", true: "ProcessFresh"}[fresh], func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			moved := acmeJob(t, b, "gone", time.Hour, "sim") // before the executor: its credential was removed
			p, arrived, release := heldProvider(t)
			ex := shareExecutor(b, p)
			done := make(chan error, 1)
			if fresh {
				// acme holds its share (alone, all but the reserve: one slot) with a call in flight,
				held := acmeJob(t, b, "sim", time.Hour)
				go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: held.ID}) }()
				awaitCall(t, arrived, done)
				// and the serve process's delivery runs its job on the fallback all the same.
				require.NoError(t, ex.ProcessFresh(ctx, moved, nil))
				require.Equal(t, 1, executor.HeldSlots(ex, "acme"), "the serve process's delivery took a slot")
			} else {
				go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: moved.ID}) }()
				awaitCall(t, arrived, done)
				require.Equal(t, 1, executor.HeldSlots(ex, "acme"), "one delivery, one slot")
			}
			close(release)
			awaitDone(t, done)
			require.Zero(t, executor.HeldSlots(ex, "acme"), "every slot given back")
			got, err := b.Store.Get(ctx, moved.ID)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusSucceeded, got.Status, "last error: %+v", got.LastError)
			require.Equal(t, "sim", *got.AnsweredBy)
		})
	}
}

// A job past its deadline is failed by the delivery that finds it so, though its tenant holds
// its share: deferred for the share, it stayed queued past its deadline for as long as the
// tenant did.
func TestExecutor_OverShareJobPastItsDeadlineFails(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	p, arrived, release := heldProvider(t)
	ex := shareExecutor(b, p)
	held, late := acmeJob(t, b, "sim", time.Hour), acmeJob(t, b, "sim", 100*time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: held.ID}) }()
	awaitCall(t, arrived, done)
	time.Sleep(time.Until(late.Deadline)) // its deadline, a known time (Postgres's on this host)

	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: late.ID}))
	got, err := b.Store.Get(ctx, late.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusFailed, got.Status)
	require.Equal(t, jobs.ReasonDeadlineExceeded, got.LastError.Class)
	require.Equal(t, 1, executor.HeldSlots(ex, "acme"), "the late job's delivery holds no slot after")

	close(release)
	awaitDone(t, done)
	require.Zero(t, executor.HeldSlots(ex, "acme"))
}

// A delivery turned away for its tenant's share leaves the job's next attempt time in its row
// when that time is not due yet (a retry delay, the delivery back early or a second task of the
// job) or is a held send slot's (on the limiter's clock, and due only as the limiter says), and
// comes back then: written over, the retry went before its delay, and the slot's time was moved
// off the limiter's clock before the slot was due.
func TestExecutor_ShareDeferralKeepsTheRowsTime(t *testing.T) {
	t.Parallel()
	for _, held := range []bool{false, true} {
		t.Run(map[bool]string{false: "RetryDelay", true: "HeldSlot"}[held], func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			p, arrived, release := heldProvider(t)
			ex := shareExecutor(b, p)
			inFlight, waiting := acmeJob(t, b, "sim", time.Hour), acmeJob(t, b, "sim", time.Hour)
			at := time.Now().Add(time.Minute)
			if held {
				ok, err := b.Store.HoldSlot(ctx, waiting.ID, at, 7, 0)
				require.NoError(t, err)
				require.True(t, ok)
			} else {
				require.NoError(t, b.Store.Postpone(ctx, waiting.ID, 0, at))
			}
			before, err := b.Store.Get(ctx, waiting.ID)
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: inFlight.ID}) }()
			awaitCall(t, arrived, done)

			perr := ex.Process(ctx, dispatch.Delivery{JobID: waiting.ID})
			var df *dispatch.DeferError
			require.ErrorAs(t, perr, &df)
			require.Contains(t, df.Reason, "share of this worker's delivery slots")
			got, err := b.Store.Get(ctx, waiting.ID)
			require.NoError(t, err)
			require.Equal(t, *before.NextAttemptAt, *got.NextAttemptAt, "the row's time was written over")
			require.Equal(t, before.SlotSeq, got.SlotSeq)
			require.False(t, df.Until.Before(*before.NextAttemptAt), "back before the row's time")

			close(release)
			awaitDone(t, done)
		})
	}
}

// TestExecutor_TurnAwayPauseHoldsNoGatePlace: the pause of a low job's delivery turned away for
// its tenant's share comes once its deferral is written and its place in the backlog gate is
// given back. With one place in the gate and 2 slots (a reserve of one), flood's call holds a
// slot; flood's low delivery is turned away and held in its pause; acme's low delivery must get
// the gate's place and its slot, and end, during that pause.
func TestExecutor_TurnAwayPauseHoldsNoGatePlace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b, ex, release, done := holdingSlot(t, executor.Config{BacklogSteps: 1, Slots: 2}, "flood")
	paused, resume := make(chan time.Duration, 1), make(chan struct{})
	var once sync.Once
	executor.SetTurnAwaySleep(ex, func(ctx context.Context, d time.Duration) error {
		once.Do(func() { paused <- d })
		select {
		case <-resume:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	job := func(tenant string, prio jobs.Priority) *jobs.Job {
		return b.Create(t, jobstest.Opts{Tenant: tenant, Priority: prio, Credential: "sim", Request: helloRequest,
			Timeout: time.Hour})
	}

	turned := job("flood", jobs.PriorityLow)
	turnedDone := make(chan error, 1)
	go func() { turnedDone <- ex.Process(ctx, dispatch.Delivery{JobID: turned.ID, Low: true}) }()
	select {
	case d := <-paused:
		require.Equal(t, 20*time.Millisecond, d)
	case err := <-turnedDone:
		t.Fatalf("flood's low delivery ended without its pause: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("flood's low delivery never paused")
	}
	got, err := b.Store.Get(ctx, turned.ID)
	require.NoError(t, err)
	require.NotNil(t, got.NextAttemptAt, "the deferral is written before the pause")

	other := job("acme", jobs.PriorityLow)
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, ex.Process(octx, dispatch.Delivery{JobID: other.ID, Low: true}),
		"acme's delivery waited for flood's pause")
	got, err = b.Store.Get(ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)

	close(resume)
	select {
	case err := <-turnedDone:
		var df *dispatch.DeferError
		require.ErrorAs(t, err, &df)
		require.Contains(t, df.Reason, "share of this worker's delivery slots")
	case <-time.After(10 * time.Second):
		t.Fatal("flood's low delivery did not end after its pause")
	}
	close(release)
	awaitDone(t, done)
}

// TestExecutor_ShareDeferralComesBackNoEarlierThanItsTime: a share deferral's time, in the row
// and asynq's, is a whole second. asynq keeps whole seconds (a task is delivered from the start
// of its second on): the task comes back at the row's time or later, never before it, to sleep
// out the rest while it holds a slot of its tenant's share and of the worker.
func TestExecutor_ShareDeferralComesBackNoEarlierThanItsTime(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	now := time.Now().Truncate(time.Second).Add(300 * time.Millisecond)
	b, ex, release, done := holdingSlot(t, executor.Config{Slots: 2, Now: func() time.Time { return now }}, "acme")
	waiting := acmeJob(t, b, "sim", time.Hour)

	perr := ex.Process(ctx, dispatch.Delivery{JobID: waiting.ID})
	var df *dispatch.DeferError
	require.ErrorAs(t, perr, &df)
	require.Contains(t, df.Reason, "share of this worker's delivery slots")
	require.Equal(t, df.Until.Truncate(time.Second), df.Until, "asynq would hand the task back before its time")
	require.Equal(t, now.Truncate(time.Second).Add(time.Second), df.Until, "the first delay (100-200 ms), rounded up")
	got, err := b.Store.Get(ctx, waiting.ID)
	require.NoError(t, err)
	require.NotNil(t, got.NextAttemptAt)
	require.True(t, got.NextAttemptAt.Equal(df.Until), "the row's time %v, asynq's %v", got.NextAttemptAt, df.Until)

	close(release)
	awaitDone(t, done)
	require.Zero(t, executor.HeldSlots(ex, "acme"))
}

// holdingSlot returns a bundle and an executor of cfg whose Store is the bundle's and whose
// credential "sim" is heldProvider's, with a delivery of a job of tenant in one of its slots,
// its call held at the provider: closing release ends the call, whose delivery answers on done.
func holdingSlot(t *testing.T, cfg executor.Config, tenant string) (*jobstest.Bundle, *executor.Executor, chan struct{}, <-chan error) {
	t.Helper()
	b := jobstest.New(t)
	p, arrived, release := heldProvider(t)
	cfg.Store = b.Store
	cfg.Upstreams = map[string]executor.Upstream{"sim": {Name: "sim", Kind: string(llm.KindAnthropic), Provider: p}}
	ex := executor.New(cfg)
	inFlight := b.Create(t, jobstest.Opts{Tenant: tenant, Credential: "sim", Request: helloRequest, Timeout: time.Hour})
	done := make(chan error, 1)
	go func() { done <- ex.Process(t.Context(), dispatch.Delivery{JobID: inFlight.ID}) }()
	awaitCall(t, arrived, done)
	return b, ex, release, done
}
