package executor_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tokens"
)

// A slot granted at or after the job's deadline (here behind a 5-minute Retry-After push-back,
// the deadline 2 minutes away) fails the job at once, deadline_exceeded, instead of holding the
// slot and waiting queued until after its own deadline.
func TestExecutor_SlotAfterTheDeadlineFailsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	lim, brk := sharedAdmission(t, redistest.Client(t))
	gate := lim.Gate("sk-pushed", "pushed")
	require.NoError(t, gate.Observe(ctx, limiter.Observation{StatusCode: 429, HasRetryAfter: true, RetryAfter: 5 * time.Minute}))
	ok := "0"
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil),
		Upstreams: map[string]executor.Upstream{"pushed": {Name: "pushed", Kind: string(llm.KindAnthropic),
			Provider: always429(t, "sk-pushed", &ok), Gate: gate, Circuit: brk.Circuit("sk-pushed", "pushed")}}})

	job, err := process(t, b, ex, "pushed", 5, 2*time.Minute)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusFailed, job.Status)
	require.Equal(t, jobs.ReasonDeadlineExceeded, job.LastError.Class)
	require.Zero(t, job.Attempts, "nothing was sent")

	// A job whose deadline comes after the slot waits for it, as before.
	job, err = process(t, b, ex, "pushed", 5, 10*time.Minute)
	var deferred *dispatch.DeferError
	require.ErrorAs(t, err, &deferred)
	require.Equal(t, jobs.StatusQueued, job.Status)
}

// A retry whose slot is the probe of a limit being learned, refused by the retry budget once the
// slot is granted (fair queueing draws on it then), hands the probe on at once: the credential's
// other attempts do not wait out the probe's hold (30 s) for an answer that will never come.
func TestExecutor_UnsentProbeIsHandedOn(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	clock := clocktest.New(time.Now())
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now})
	require.NoError(t, err)
	gate := lim.Gate("sk-probe", "probe")
	ex := executor.New(executor.Config{Store: b.Store, Policy: retrypolicy.New(nil), Now: clock.Now,
		TenantWeight: func(context.Context, string) (int, error) { return 1, nil },
		Upstreams: map[string]executor.Upstream{"probe": {Name: "probe", Kind: string(llm.KindAnthropic),
			Provider: simProvider(t, llmsim.Config{}, "sk-probe"), Gate: gate}}})
	job := b.Create(t, jobstest.Opts{Credential: "probe", Timeout: time.Hour})
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying}) // failed once: the next is a retry
	// Spend the retry budget.
	for range 1000 {
		ok, err := gate.AllowRetry(ctx, "")
		require.NoError(t, err)
		if !ok {
			break
		}
	}
	ok, err := gate.AllowRetry(ctx, "")
	require.NoError(t, err)
	require.False(t, ok, "the retry budget is spent")

	err = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, err, &deferred)
	require.Contains(t, deferred.Reason, "retry budget spent")

	clock.Advance(time.Second)
	r, err := gate.Reserve(ctx, limiter.Limit{})
	require.NoError(t, err)
	require.True(t, r.Granted && r.Probe, "the next attempt is the probe: %+v", r)
}

// unsentBundle is a paused credential, "capped", whose automatic probe (one per probeEvery) is
// due, with an output token limit of helloRequest's max_tokens per token minute, the whole of
// which the test took: a delivery's slot comes one token minute on.
type unsentBundle struct {
	b     *jobstest.Bundle
	gate  *limiter.Gate
	limit limiter.Limit
	ex    *executor.Executor
	reg   *prometheus.Registry
	sim   *llmsim.Server
	clock *clocktest.Clock
}

const probeEvery = 30 * time.Second

// unsentSetup builds an unsentBundle whose token minute is tokenMinute.
func unsentSetup(t *testing.T, tokenMinute time.Duration) *unsentBundle {
	t.Helper()
	ctx := t.Context()
	clock := clocktest.New(time.Now())
	reg := prometheus.NewRegistry()
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now,
		TokenMinute: tokenMinute, Metrics: limiter.NewMetrics(reg)})
	require.NoError(t, err)
	gate := lim.Gate("sk-capped", "capped")
	est, err := estimator.New(nil)
	require.NoError(t, err)
	b := jobstest.New(t)
	limit := limiter.Limit{Rate: 100, Burst: 100, OutputTokensPerMinute: 16} // helloRequest's max_tokens
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-capped"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: b.Store, Estimator: est, Upstreams: map[string]executor.Upstream{
		"capped": {Name: "capped", Kind: string(llm.KindAnthropic), Provider: p,
			Gate: gate, Limit: limit, PauseProbeInterval: probeEvery}}})
	// The credential is paused, its first probe due,
	_, err = gate.Pause(ctx, "rate_limited_no_retry_after", "first")
	require.NoError(t, err)
	clock.Advance(probeEvery)
	// and the test takes the token minute's output tokens.
	r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Zero(t, r.Wait)
	return &unsentBundle{b: b, gate: gate, limit: limit, ex: ex, reg: reg, sim: sim, clock: clock}
}

// grants is how many slots the credential's gate granted.
func (u *unsentBundle) grants(t *testing.T) uint64 {
	t.Helper()
	mfs, err := u.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "llmq_limiter_wait_seconds" {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// requireHandedBack checks that the delivery's probe and tokens were given back: the next probe
// may go at once, and once the test's token minute has passed, 16 output tokens go at once
// (the unsent attempt's would have taken that minute's refill).
func (u *unsentBundle) requireHandedBack(t *testing.T, tokenMinute time.Duration) {
	t.Helper()
	ctx := t.Context()
	p, err := u.gate.TryProbe(ctx, probeEvery)
	require.NoError(t, err)
	require.True(t, p.Granted(), "the unsent probe was not handed back: the next one waits its interval (%s)", probeEvery)
	u.clock.Advance(tokenMinute)
	r, err := u.gate.ReserveCost(ctx, u.limit, tokens.Cost{OutputTokens: 16})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Less(t, r.Wait, tokenMinute/2, "the unsent attempt's tokens were not refunded")
}

// A paused credential's automatic probe, granted with a slot and then not sent, is handed back
// with the slot's tokens: the next probe goes at once, not a whole interval later (probes are
// what ends a pause without an operator), and the tokens do not push later slots back.
func TestExecutor_UnsentPauseProbeIsHandedBack(t *testing.T) {
	t.Parallel()

	// The job is canceled (its delivery's context ends) while it waits for its slot.
	t.Run("CanceledWhileWaiting", func(t *testing.T) {
		t.Parallel()
		tokenMinute := 2 * time.Second // the slot is slept out (within MaxInlineWait)
		u := unsentSetup(t, tokenMinute)
		job := u.b.Create(t, jobstest.Opts{Credential: "capped", Timeout: time.Hour, Request: helloRequest})
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()
		// The delivery's slot is granted (after its probe): it sleeps until the slot.
		require.Eventually(t, func() bool { return u.grants(t) == 2 }, 30*time.Second, 5*time.Millisecond)
		cancel()
		select {
		case err := <-done:
			require.ErrorIs(t, err, context.Canceled)
		case <-time.After(30 * time.Second):
			t.Fatal("the delivery did not end with its context")
		}
		require.Zero(t, u.sim.Stats().Requests, "nothing was sent")
		u.requireHandedBack(t, tokenMinute)
	})

	// The slot is slept out, and the attempt's start is refused (a store failing; a job
	// canceled meanwhile takes the same way out).
	t.Run("BeginFails", func(t *testing.T) {
		t.Parallel()
		tokenMinute := 2 * time.Second
		u := unsentSetup(t, tokenMinute)
		_, err := u.b.Pool.Exec(t.Context(), `
CREATE FUNCTION refuse_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'running' THEN RAISE EXCEPTION 'start refused'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_start BEFORE UPDATE OF status ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_start()`)
		require.NoError(t, err)
		job := u.b.Create(t, jobstest.Opts{Credential: "capped", Timeout: time.Hour, Request: helloRequest})
		require.ErrorContains(t, u.ex.Process(t.Context(), dispatch.Delivery{JobID: job.ID}), "start refused")
		require.Zero(t, u.sim.Stats().Requests, "nothing was sent")
		u.requireHandedBack(t, tokenMinute)
	})

	// The slot is too far off to sleep out, and holding it in the job row fails.
	t.Run("HoldSlotFails", func(t *testing.T) {
		t.Parallel()
		tokenMinute := time.Minute
		u := unsentSetup(t, tokenMinute)
		refuseSlots(t, u.b)
		job := u.b.Create(t, jobstest.Opts{Credential: "capped", Timeout: time.Hour, Request: helloRequest})
		err := u.ex.Process(t.Context(), dispatch.Delivery{JobID: job.ID})
		require.ErrorContains(t, err, "slot refused")
		var deferred *dispatch.DeferError
		require.False(t, errors.As(err, &deferred))
		got, err := u.b.Store.Get(t.Context(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, got.Status)
		require.Zero(t, u.sim.Stats().Requests, "nothing was sent")
		u.requireHandedBack(t, tokenMinute)
	})
}

// A new job's first attempt admitted before its insert (AdmitFirst) whose slot its delivery does
// not send, its job canceled while it waits for the slot or the slot refused by the job row, gives
// the slot's tokens back: they do not push the credential's later slots back.
func TestExecutor_UnsentFirstAdmissionIsHandedBack(t *testing.T) {
	t.Parallel()
	// setup returns a job created with its first attempt admitted by ex, the slot one token minute
	// away (the test took the minute's output tokens), and what requireRefunded needs.
	setup := func(t *testing.T, tokenMinute time.Duration) (*jobstest.Bundle, *executor.Executor, *jobs.Job, dispatch.Admission, func()) {
		t.Helper()
		ctx := t.Context()
		clock := clocktest.New(time.Now())
		prefix := redistest.Prefix(t)
		lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: prefix, Now: clock.Now, TokenMinute: tokenMinute})
		require.NoError(t, err)
		brk, err := breaker.New(redistest.Client(t), &breaker.Config{Prefix: prefix, Now: clock.Now})
		require.NoError(t, err)
		gate, circuit := lim.Gate("sk-first", "first"), brk.Circuit("sk-first", "first")
		// A warm breaker: the reservation's own test of it admits.
		a, err := circuit.Allow(ctx)
		require.NoError(t, err)
		_, err = circuit.Report(ctx, a, breaker.Success)
		require.NoError(t, err)
		est, err := estimator.New(nil)
		require.NoError(t, err)
		b := jobstest.New(t)
		limit := limiter.Limit{Rate: 100, Burst: 100, OutputTokensPerMinute: 16}
		ex := executor.New(executor.Config{Store: b.Store, Estimator: est, Upstreams: map[string]executor.Upstream{
			"first": {Name: "first", Kind: string(llm.KindAnthropic), Provider: simProvider(t, llmsim.Config{}, "sk-first"),
				Gate: gate, Circuit: circuit, Limit: limit}}})
		r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
		require.NoError(t, err)
		require.True(t, r.Granted)

		p := jobs.CreateParams{Tenant: "default", Credential: "first", Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour}
		prepared, err := b.Store.Prepare(&p)
		require.NoError(t, err)
		adm := ex.AdmitFirst(ctx, prepared)
		require.NotNil(t, adm, "the first attempt is admitted before the insert")
		require.Nil(t, adm.Begin(), "its slot is a token minute away")
		p.Admit = func(context.Context, *jobs.Job) *jobs.Begin { return adm.Begin() }
		job, _, err := b.Store.Create(ctx, p)
		require.NoError(t, err)
		requireRefunded := func() {
			t.Helper()
			clock.Advance(tokenMinute)
			r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
			require.NoError(t, err)
			require.True(t, r.Granted)
			require.Less(t, r.Wait, tokenMinute/2, "the unsent attempt's tokens were not refunded")
		}
		return b, ex, job, adm, requireRefunded
	}

	t.Run("CanceledWhileWaiting", func(t *testing.T) {
		t.Parallel()
		_, ex, job, adm, requireRefunded := setup(t, 2*time.Second) // slept out, within MaxInlineWait
		ctx, cancel := context.WithCancel(t.Context())
		cancel() // the job was canceled: its delivery's context has ended
		require.ErrorIs(t, ex.ProcessFresh(ctx, job, adm), context.Canceled)
		requireRefunded()
	})

	t.Run("HoldSlotFails", func(t *testing.T) {
		t.Parallel()
		b, ex, job, adm, requireRefunded := setup(t, time.Minute)
		refuseSlots(t, b)
		require.ErrorContains(t, ex.ProcessFresh(t.Context(), job, adm), "slot refused")
		requireRefunded()
	})
}

// refuseSlots makes Postgres refuse to hold a limiter slot in any job row (jobs.Store.HoldSlot).
func refuseSlots(t *testing.T, b *jobstest.Bundle) {
	t.Helper()
	_, err := b.Pool.Exec(t.Context(), `
CREATE FUNCTION refuse_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.slot_seq IS NOT NULL THEN RAISE EXCEPTION 'slot refused'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_slot BEFORE UPDATE OF slot_seq ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_slot()`)
	require.NoError(t, err)
}

// A slot held in the job row (its wait was too long to sleep out) is not sent while the
// credential is paused: a spend cap that came meanwhile stops it as it stops every other
// attempt, instead of each held slot going out, being refused and dead-lettering its job.
func TestExecutor_HeldSlotWaitsForThePause(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := clocktest.New(time.Now())
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now})
	require.NoError(t, err)
	gate := lim.Gate("sk-held", "held")
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-held"})
	require.NoError(t, err)
	limit := limiter.Limit{Rate: 0.1, Burst: 1} // a slot every 10 s
	b := jobstest.New(t)
	ex := executor.New(executor.Config{Store: b.Store, Now: clock.Now, Upstreams: map[string]executor.Upstream{
		"held": {Name: "held", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate, Limit: limit}}})
	r, err := gate.Reserve(ctx, limit) // the test takes the slot at hand
	require.NoError(t, err)
	require.True(t, r.Granted)

	// The job's slot is 10 s away: it is held in the job row.
	job := b.Create(t, jobstest.Opts{Credential: "held", Timeout: time.Hour, Request: helloRequest})
	err = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, err, &deferred)
	require.Contains(t, deferred.Reason, "rate limit slot")
	// Meanwhile a spend cap pauses the credential; the slot comes due.
	_, err = gate.Pause(ctx, "rate_limited_no_retry_after", "other")
	require.NoError(t, err)
	clock.Advance(11 * time.Second)

	err = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	require.Zero(t, sim.Stats().Requests, "a held slot was sent on a paused credential")
	require.ErrorAs(t, err, &deferred)
	require.Contains(t, deferred.Reason, "credential paused")

	// Once resumed, the held slot goes.
	_, err = gate.Resume(ctx)
	require.NoError(t, err)
	clock.Advance(10 * time.Second)
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.Equal(t, 1, sim.Stats().Requests)
}

// A delivery of a slot held in the job row makes one Redis round trip before its send: the
// limiter's clock (the slot's time is on it) and the credential's pause state (a held slot does
// not go on a paused credential) are read together. Under a rate-limit backlog most deliveries
// are such; reading them apart cost each a second round trip.
func TestExecutor_HeldSlotDeliveryOneRoundTripBeforeTheSend(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := clocktest.New(time.Now())
	rdb := redistest.Client(t)
	trips := &redistest.Trips{}
	rdb.AddHook(trips)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now})
	require.NoError(t, err)
	gate := lim.Gate("sk-held-trips", "held")
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-held-trips"})
	require.NoError(t, err)
	sent := &tripsAtSend{Provider: p, trips: trips}
	limit := limiter.Limit{Rate: 0.1, Burst: 1} // a slot every 10 s
	b := jobstest.New(t)
	ex := executor.New(executor.Config{Store: b.Store, Now: clock.Now, Upstreams: map[string]executor.Upstream{
		"held": {Name: "held", Kind: string(llm.KindAnthropic), Provider: sent, Gate: gate, Limit: limit}}})
	r, err := gate.Reserve(ctx, limit) // the test takes the slot at hand
	require.NoError(t, err)
	require.True(t, r.Granted)
	job := b.Create(t, jobstest.Opts{Credential: "held", Timeout: time.Hour, Request: helloRequest})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
	require.Contains(t, deferred.Reason, "rate limit slot")
	// Every script the delivery may run is in Redis's script cache (a cold one costs an EVAL
	// after the EVALSHA's NOSCRIPT, a round trip more, once per server).
	_, err = gate.Now(ctx)
	require.NoError(t, err)
	_, _, err = gate.NowAndPaused(ctx)
	require.NoError(t, err)

	clock.Advance(11 * time.Second) // the slot is due
	before := trips.Count()
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	require.Equal(t, 1, sim.Stats().Requests)
	require.Equal(t, 1, int(sent.at.Load())-before, "Redis round trips of a held slot's delivery before its send")
}

// tripsAtSend is a provider that notes the Redis round trips counted when a request is sent.
type tripsAtSend struct {
	llm.Provider
	trips *redistest.Trips
	at    atomic.Int64
}

func (p *tripsAtSend) Send(ctx context.Context, body []byte, opts llm.SendOptions) (*llm.Response, error) {
	p.at.Store(int64(p.trips.Count()))
	return p.Provider.Send(ctx, body, opts)
}

// A slot held in the job row belongs to the row, not to the delivery that read it: a delivery
// whose attempt's start fails (a store failing; another delivery's lease, taken since the read,
// takes the same way out) leaves its tokens charged, for the delivery that sends the slot (the
// retried one, or the lease's holder) reconciles them. Refunded here, the slot still went out
// later, its tokens never charged: another request's worth went into the token minute.
func TestExecutor_HeldSlotKeepsItsTokensWhenTheStartFails(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const tokenMinute = heldMinute
	u := heldSetup(t, heldOpts{})
	b, gate, limit, ex, sim, clock := u.b, u.gate, u.limit, u.ex, u.sim, u.clock
	job := u.hold(t, time.Hour)

	// The slot is due; its delivery's start fails.
	clock.Advance(tokenMinute)
	_, err := b.Pool.Exec(ctx, `
CREATE FUNCTION refuse_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.status = 'running' THEN RAISE EXCEPTION 'start refused'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_start BEFORE UPDATE OF status ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_start()`)
	require.NoError(t, err)
	require.ErrorContains(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), "start refused")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.NotNil(t, got.SlotSeq, "the row still holds the slot, for the delivery dispatch retries")

	// The slot's tokens are still charged: the minute's next 16 tokens wait for the next minute.
	r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.GreaterOrEqual(t, r.Wait, tokenMinute/2, "the held slot's tokens were refunded, and the slot is still to go")

	// The retried delivery sends the held slot.
	_, err = b.Pool.Exec(ctx, `DROP TRIGGER refuse_start ON jobs`)
	require.NoError(t, err)
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	require.Equal(t, 1, sim.Stats().Requests)
}

// A held slot on a credential paused since is given back when its job moves to its fallback, and
// only then: when the move fails (Postgres refusing it here; or another delivery took the job
// meanwhile), the row still holds the slot, and the delivery that sends it (once the credential
// is resumed) reconciles its tokens. Refunded before the move, the slot still went out later
// with its tokens never charged (a grant is reconciled once): another request's worth went into
// the token minute.
func TestExecutor_HeldSlotOfAJobFailingOver(t *testing.T) {
	t.Parallel()
	const tokenMinute = time.Minute
	limit := limiter.Limit{Rate: 100, Burst: 100, OutputTokensPerMinute: 16} // helloRequest's max_tokens
	// setup holds a slot a minute away for a job with a fallback, pauses its credential and
	// lets the slot come due.
	setup := func(t *testing.T) (*jobstest.Bundle, *executor.Executor, *limiter.Gate, *llmsim.Server, *jobs.Job) {
		u := heldSetup(t, heldOpts{backup: true})
		job := u.holdWithFallback(t)
		// The credential is paused; the slot is due.
		_, err := u.gate.Pause(t.Context(), "rate_limited_no_retry_after", "other")
		require.NoError(t, err)
		u.clock.Advance(tokenMinute)
		return u.b, u.ex, u.gate, u.sim, job
	}
	answeredBy := func(t *testing.T, b *jobstest.Bundle, id, want string) {
		t.Helper()
		got, err := b.Store.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status)
		require.NotNil(t, got.AnsweredBy)
		require.Equal(t, want, *got.AnsweredBy)
	}

	t.Run("Moved", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b, ex, gate, sim, job := setup(t)
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		require.Equal(t, 1, sim.Stats().Requests)
		answeredBy(t, b, job.ID, "backup")
		// The slot left with the job: its tokens are given back, the minute's next 16 go now.
		r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.Less(t, r.Wait, tokenMinute/2, "the slot the job left still holds its tokens")
	})

	t.Run("MoveFails", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		b, ex, gate, sim, job := setup(t)
		_, err := b.Pool.Exec(ctx, `
CREATE FUNCTION refuse_move() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'move refused';
END $$;
CREATE TRIGGER refuse_move BEFORE UPDATE OF credential_index ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_move()`)
		require.NoError(t, err)
		require.ErrorContains(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), "move refused")
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.NotNil(t, got.SlotSeq, "the row still holds the slot")

		// The slot's tokens are still charged: the minute's next 16 tokens wait for the next minute.
		r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
		require.NoError(t, err)
		require.True(t, r.Granted)
		require.GreaterOrEqual(t, r.Wait, tokenMinute/2, "the held slot's tokens were refunded, and the slot is still to go")

		// Resumed, the retried delivery sends the held slot on its credential.
		_, err = b.Pool.Exec(ctx, `DROP TRIGGER refuse_move ON jobs`)
		require.NoError(t, err)
		_, err = gate.Resume(ctx)
		require.NoError(t, err)
		require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		require.Equal(t, 1, sim.Stats().Requests)
		answeredBy(t, b, job.ID, "held")
	})
}

// A paused credential's automatic probe whose slot is too far off to sleep out is held in the
// job row with its slot, and goes when the slot is due: the pause's check of a held slot lets
// that one through. Refused as any other held slot would be (the interval's probe is taken, by
// it), the probe went an interval later, and a lifted cap ended its pause that much later.
func TestExecutor_HeldPauseProbeGoes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tokenMinute := 10 * time.Second // past MaxInlineWait, within probeEvery
	u := unsentSetup(t, tokenMinute)
	job := u.b.Create(t, jobstest.Opts{Credential: "capped", Timeout: time.Hour, Request: helloRequest})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
	require.Contains(t, deferred.Reason, "rate limit slot", "the probe's slot is held")

	u.clock.Advance(tokenMinute)
	require.NoError(t, u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	require.Equal(t, 1, u.sim.Stats().Requests, "the held probe was not sent")
	got, err := u.b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	ps, err := u.gate.Paused(ctx)
	require.NoError(t, err)
	require.False(t, ps.Paused, "the probe's success resumes the credential")
}

// A held slot read as paused just before the short wait for its time, and resumed during that
// wait, goes on its credential when the wait ends. Acted on as read, the stale pause deferred
// the job as "credential paused" or, with a fallback, moved it off a credential serving again
// (for good: its slot given back); a reservation never acts on a pause read before a sleep.
func TestExecutor_HeldSlotResumedDuringItsWaitGoes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := clocktest.New(time.Now())
	rdb := redistest.Client(t)
	after := &afterNext{}
	rdb.AddHook(after)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now})
	require.NoError(t, err)
	gate := lim.Gate("sk-held-resumed", "held")
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-held-resumed"})
	require.NoError(t, err)
	limit := limiter.Limit{Rate: 0.1, Burst: 1} // a slot every 10 s
	b := jobstest.New(t)
	ex := executor.New(executor.Config{Store: b.Store, Now: clock.Now, Upstreams: map[string]executor.Upstream{
		"held":   {Name: "held", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate, Limit: limit},
		"backup": {Name: "backup", Kind: string(llm.KindAnthropic), Provider: p}}})
	r, err := gate.Reserve(ctx, limit) // the test takes the slot at hand
	require.NoError(t, err)
	require.True(t, r.Granted)
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "held", Fallbacks: []string{"backup"},
		Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	var deferred *dispatch.DeferError
	require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
	require.Contains(t, deferred.Reason, "rate limit slot")

	// The credential is paused; the delivery comes a little early for its slot (asynq hands a
	// task back up to a second early), reads the pause, and the credential is resumed while it
	// sleeps out the rest: the delivery's first Redis call is that read.
	_, err = gate.Pause(ctx, "rate_limited_no_retry_after", "other")
	require.NoError(t, err)
	clock.Advance(10*time.Second - 200*time.Millisecond)
	after.arm(func() {
		_, err := gate.Resume(context.WithoutCancel(ctx))
		require.NoError(t, err)
	})
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	require.False(t, after.armed(), "the resume ran")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.NotNil(t, got.AnsweredBy)
	require.Equal(t, "held", *got.AnsweredBy, "the job left a credential resumed before its send")
	require.Equal(t, 1, sim.Stats().Requests)
}

// afterNext is a go-redis hook that runs f once, after the next command (or pipeline) the
// client sends once armed has returned; f may arm the next.
type afterNext struct{ f atomic.Pointer[func()] }

func (h *afterNext) arm(f func()) { h.f.Store(&f) }

func (h *afterNext) armed() bool { return h.f.Load() != nil }

func (h *afterNext) run() {
	if f := h.f.Swap(nil); f != nil {
		(*f)()
	}
}

func (h *afterNext) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *afterNext) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.run()
		return err
	}
}

func (h *afterNext) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.run()
		return err
	}
}

// A held slot's delivery that waits for its breaker reads the pause again after the wait: the
// state read with the limiter's clock, before it, said not paused, and the credential was paused
// while the delivery waited for the breaker's probe.
func TestExecutor_HeldSlotPausedDuringItsBreakerWaitStays(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := clocktest.New(time.Now())
	rdb := redistest.Client(t)
	after := &afterNext{}
	rdb.AddHook(after)
	prefix := redistest.Prefix(t)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: prefix, Now: clock.Now})
	require.NoError(t, err)
	const cooldown = 100 * time.Millisecond
	brk, err := breaker.New(rdb, &breaker.Config{Prefix: prefix + "brk:", Now: clock.Now, Threshold: 1, Cooldown: cooldown})
	require.NoError(t, err)
	gate := lim.Gate("sk-held-brk", "held")
	circuit := brk.Circuit("sk-held-brk", "held")
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-held-brk"})
	require.NoError(t, err)
	limit := limiter.Limit{Rate: 0.1, Burst: 1} // a slot every 10 s
	b := jobstest.New(t)
	ex := executor.New(executor.Config{Store: b.Store, Now: clock.Now, Upstreams: map[string]executor.Upstream{
		"held": {Name: "held", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate, Circuit: circuit, Limit: limit}}})
	r, err := gate.Reserve(ctx, limit) // the test takes the slot at hand
	require.NoError(t, err)
	require.True(t, r.Granted)
	job := b.Create(t, jobstest.Opts{Credential: "held", Timeout: time.Hour, Request: helloRequest})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
	require.Contains(t, deferred.Reason, "rate limit slot")

	// The slot is due; the breaker opens (its cooldown short enough to wait for).
	clock.Advance(10 * time.Second)
	a, err := circuit.Allow(ctx)
	require.NoError(t, err)
	require.True(t, a.Allowed)
	_, err = circuit.Report(ctx, a, breaker.Failure)
	require.NoError(t, err)
	// The credential is paused right after the delivery's first Redis call (the clock and the
	// pause, read together: not paused); its breaker refuses it, and its cooldown ends while it
	// waits (the clock moved on after that refusal), when the delivery becomes the probe.
	after.arm(func() {
		_, err := gate.Pause(context.WithoutCancel(ctx), "rate_limited_no_retry_after", "other")
		require.NoError(t, err)
		after.arm(func() { clock.Advance(cooldown) })
	})
	err = ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	require.False(t, after.armed(), "the pause ran")
	require.Zero(t, sim.Stats().Requests, "a held slot was sent on a paused credential")
	require.ErrorAs(t, err, &deferred)
	require.Contains(t, deferred.Reason, "credential paused")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.NotNil(t, got.SlotSeq, "the slot is kept")
}

// A held slot whose job fails over from an open breaker is given back once the job has moved,
// as one failing over from a pause is: the job's row no longer holds it, and nothing else would
// refund its tokens (the credential's next requests waited for a slot that never went).
func TestExecutor_HeldSlotOfAJobFailingOverFromAnOpenBreaker(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const tokenMinute = heldMinute
	u := heldSetup(t, heldOpts{circuit: true, backup: true})
	b, gate, circuit, limit, ex, sim, clock := u.b, u.gate, u.circuit, u.limit, u.ex, u.sim, u.clock
	job := u.holdWithFallback(t)
	// The slot is due; the credential's breaker is open.
	clock.Advance(tokenMinute)
	for {
		a, err := circuit.Allow(ctx)
		require.NoError(t, err)
		if !a.Allowed {
			break
		}
		_, err = circuit.Report(ctx, a, breaker.Failure)
		require.NoError(t, err)
	}

	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	require.Equal(t, 1, sim.Stats().Requests)
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusSucceeded, got.Status)
	require.NotNil(t, got.AnsweredBy)
	require.Equal(t, "backup", *got.AnsweredBy)
	// The slot left with the job: its tokens are given back, the minute's next 16 go now.
	r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
	require.NoError(t, err)
	require.True(t, r.Granted)
	require.Less(t, r.Wait, tokenMinute/2, "the slot the job left still holds its tokens")
}
