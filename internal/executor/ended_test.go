package executor_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
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
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tokens"
)

// heldBundle is a credential, "held", with an output token limit of helloRequest's max_tokens
// per minute, the first minute of which the test took: a job's slot comes a minute on, held in
// its row.
type heldBundle struct {
	b       *jobstest.Bundle
	gate    *limiter.Gate
	circuit *breaker.Circuit // heldOpts.circuit, else nil
	limit   limiter.Limit
	ex      *executor.Executor
	sim     *llmsim.Server
	clock   *clocktest.Clock
	after   *afterNext
}

// heldMinute is the held credential's token minute.
const heldMinute = time.Minute

// heldOpts shapes heldSetup's credentials.
type heldOpts struct {
	circuit bool // "held" has a breaker: one failure opens it for an hour
	backup  bool // a credential "backup", without limits, on the same simulator
}

func heldSetup(t *testing.T, o heldOpts) *heldBundle {
	t.Helper()
	ctx := t.Context()
	clock := clocktest.New(time.Now())
	rdb := redistest.Client(t)
	after := &afterNext{}
	rdb.AddHook(after)
	prefix := redistest.Prefix(t)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: prefix, Now: clock.Now, TokenMinute: heldMinute})
	require.NoError(t, err)
	gate := lim.Gate("sk-held", "held")
	var circuit *breaker.Circuit
	if o.circuit {
		brk, err := breaker.New(rdb, &breaker.Config{Prefix: prefix + "brk:", Now: clock.Now, Threshold: 1, Cooldown: time.Hour})
		require.NoError(t, err)
		circuit = brk.Circuit("sk-held", "held")
	}
	est, err := estimator.New(nil)
	require.NoError(t, err)
	b := jobstest.New(t)
	limit := limiter.Limit{Rate: 100, Burst: 100, OutputTokensPerMinute: 16} // helloRequest's max_tokens
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-held"})
	require.NoError(t, err)
	upstreams := map[string]executor.Upstream{
		"held": {Name: "held", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate, Limit: limit}}
	if circuit != nil {
		up := upstreams["held"]
		up.Circuit = circuit
		upstreams["held"] = up
	}
	if o.backup {
		upstreams["backup"] = executor.Upstream{Name: "backup", Kind: string(llm.KindAnthropic), Provider: p}
	}
	ex := executor.New(executor.Config{Store: b.Store, Estimator: est, Now: clock.Now, Upstreams: upstreams})
	// The test takes the token minute's output tokens: a job's slot is a minute away, held.
	r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
	require.NoError(t, err)
	require.True(t, r.Granted)
	return &heldBundle{b: b, gate: gate, circuit: circuit, limit: limit, ex: ex, sim: sim, clock: clock, after: after}
}

// hold creates a job (its deadline timeout away) whose slot, a minute away, its first delivery
// holds in its row.
func (u *heldBundle) hold(t *testing.T, timeout time.Duration) *jobs.Job {
	t.Helper()
	job := u.b.Create(t, jobstest.Opts{Credential: "held", Timeout: timeout, Request: helloRequest})
	var deferred *dispatch.DeferError
	require.ErrorAs(t, u.ex.Process(t.Context(), dispatch.Delivery{JobID: job.ID}), &deferred)
	require.Contains(t, deferred.Reason, "rate limit slot")
	got, err := u.b.Store.Get(t.Context(), job.ID)
	require.NoError(t, err)
	require.NotNil(t, got.SlotSeq)
	return got
}

// holdWithFallback is hold for a job whose fallback is "backup" (heldOpts.backup), its deadline
// an hour away.
func (u *heldBundle) holdWithFallback(t *testing.T) *jobs.Job {
	t.Helper()
	job, _, err := u.b.Store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "held",
		Fallbacks: []string{"backup"}, Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	var deferred *dispatch.DeferError
	require.ErrorAs(t, u.ex.Process(t.Context(), dispatch.Delivery{JobID: job.ID}), &deferred)
	require.Contains(t, deferred.Reason, "rate limit slot")
	return job
}

// nextWait is the wait of the credential's next 16 output tokens, asked once the test's token
// minute has passed: the held slot's minute comes next, refunded or not.
func (u *heldBundle) nextWait(t *testing.T) time.Duration {
	t.Helper()
	u.clock.Advance(heldMinute)
	return u.waitNow(t)
}

// waitNow is the wait of the credential's next 16 output tokens, asked now.
func (u *heldBundle) waitNow(t *testing.T) time.Duration {
	t.Helper()
	r, err := u.gate.ReserveCost(t.Context(), u.limit, tokens.Cost{OutputTokens: 16})
	require.NoError(t, err)
	require.True(t, r.Granted)
	return r.Wait
}

// A job that ended while it held a slot in its row (canceled, or failed by the deadline pass,
// while it waited for the slot's time) gives the slot's tokens back when its task comes back
// (dispatch.Tasks.AbortHeld runs it at once): they pushed every later ask of the credential a
// whole token minute back (the next 16 tokens went at +2m, not +1m). Once: a second delivery
// of the ended job gives nothing more back.
func TestExecutor_EndedJobGivesItsHeldSlotBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, u *heldBundle, job *jobs.Job)
	}{
		{"Canceled", func(t *testing.T, u *heldBundle, job *jobs.Job) {
			_, err := u.b.Store.Cancel(t.Context(), job.ID)
			require.NoError(t, err)
		}},
		{"FailedByTheDeadlinePass", func(t *testing.T, u *heldBundle, job *jobs.Job) {
			failed, err := u.b.Store.FailOverdue(t.Context(), job.Deadline, 10)
			require.NoError(t, err)
			require.Len(t, failed, 1)
			require.True(t, failed[0].HeldSlot)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			u := heldSetup(t, heldOpts{})
			job := u.hold(t, time.Hour)
			tc.end(t, u, job)

			require.NoError(t, u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
			require.Less(t, u.nextWait(t), heldMinute/2, "the ended job's held slot still holds its tokens")
			got, err := u.b.Store.Get(ctx, job.ID)
			require.NoError(t, err)
			require.Nil(t, got.SlotSeq, "the slot was taken from the row: given back once")
			require.NoError(t, u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
			require.Zero(t, u.sim.Stats().Requests)
		})
	}
}

// A held slot whose delivery finds the job's deadline passed (a pause or an open breaker kept
// it, or the worker came late) fails the job and gives the slot back: nothing else would.
func TestExecutor_HeldSlotPastTheDeadlineIsGivenBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := heldSetup(t, heldOpts{})
	job := u.hold(t, 65*time.Second) // the slot at +1m, the deadline 5 s after it
	// Past the deadline as Postgres set it (its clock at the insert, which a loaded machine makes
	// later than the test clock's start by seconds), and so past the slot's time.
	u.clock.Set(job.Deadline.Add(2 * time.Second))

	require.NoError(t, u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	// The slot's minute (+1m to +2m) is free again: 16 tokens go now rather than at +2m.
	require.Less(t, u.waitNow(t), 30*time.Second, "the failed job's held slot still holds its tokens")
	got, err := u.b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusFailed, got.Status)
	require.Equal(t, jobs.ReasonDeadlineExceeded, got.LastError.Class)
	require.Nil(t, got.SlotSeq)
	require.Zero(t, u.sim.Stats().Requests)
}

// A job canceled after its delivery's reservation and before the slot is held in its row (the
// row refuses it: the job no longer waits) gives the slot back at once: the row holds nothing,
// so no later delivery could.
func TestExecutor_SlotOfAJobCanceledBeforeItsHoldIsGivenBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := heldSetup(t, heldOpts{})
	job := u.b.Create(t, jobstest.Opts{Credential: "held", Timeout: time.Hour, Request: helloRequest})
	// The delivery's first Redis call is its reservation.
	u.after.arm(func() {
		_, err := u.b.Store.Cancel(context.WithoutCancel(ctx), job.ID)
		require.NoError(t, err)
	})
	err := u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	require.False(t, u.after.armed())
	require.Less(t, u.nextWait(t), heldMinute/2, "the canceled job's slot still holds its tokens")
	require.NoError(t, err, "the job ended: nothing more to do")
	got, err := u.b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Nil(t, got.SlotSeq)
}

// A duplicate delivery whose slot the row refuses because another delivery's attempt took the
// job meanwhile (its lease live, the job not ended) gives the slot back and is deferred as the
// guard defers a leased job: its task may be the only one left (the holder's lost), and ended as
// done it dropped the job until the sweeper found it.
func TestExecutor_SlotRefusedForALeasedJobDefers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := heldSetup(t, heldOpts{})
	job := u.b.Create(t, jobstest.Opts{Credential: "held", Timeout: time.Hour, Request: helloRequest})
	// The delivery's first Redis call is its reservation: the other delivery starts its attempt
	// after it, before the slot is held in the row.
	u.after.arm(func() {
		_, err := u.b.Store.BeginAttempt(context.WithoutCancel(ctx), job.ID)
		require.NoError(t, err)
	})
	err := u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID})
	require.False(t, u.after.armed())
	var deferred *dispatch.DeferError
	require.ErrorAs(t, err, &deferred, "the leased job's duplicate delivery ended as done")
	require.Equal(t, "another delivery's attempt holds the job", deferred.Reason)
	require.False(t, deferred.Until.After(u.clock.Now().Add(2*time.Second)), "looks again as a leased job's delivery does")
	got, err := u.b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusRunning, got.Status)
	require.Nil(t, got.SlotSeq)
	require.Less(t, u.nextWait(t), heldMinute/2, "the refused slot still holds its tokens")
}

// A pause probe held with a slot in the job row (the paused credential's interval's one
// attempt) goes back when its job ends (canceled here) or fails over from an open breaker: kept,
// it held the credential's next probe back a whole interval, and with it the end of a pause
// whose cap was lifted.
func TestExecutor_HeldPauseProbeIsGivenBack(t *testing.T) {
	t.Parallel()
	tokenMinute := 10 * time.Second // past MaxInlineWait, within probeEvery: the probe's slot is held

	t.Run("Canceled", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		u := unsentSetup(t, tokenMinute)
		job := u.b.Create(t, jobstest.Opts{Credential: "capped", Timeout: time.Hour, Request: helloRequest})
		var deferred *dispatch.DeferError
		require.ErrorAs(t, u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
		require.Contains(t, deferred.Reason, "rate limit slot", "the probe's slot is held")
		_, err := u.b.Store.Cancel(ctx, job.ID)
		require.NoError(t, err)

		require.NoError(t, u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
		require.Zero(t, u.sim.Stats().Requests)
		u.requireHandedBack(t, tokenMinute)
	})

	t.Run("FailedOverFromAnOpenBreaker", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		clock := clocktest.New(time.Now())
		rdb := redistest.Client(t)
		prefix := redistest.Prefix(t)
		lim, err := limiter.New(rdb, &limiter.Config{Prefix: prefix, Now: clock.Now, TokenMinute: tokenMinute})
		require.NoError(t, err)
		brk, err := breaker.New(rdb, &breaker.Config{Prefix: prefix + "brk:", Now: clock.Now, Threshold: 1, Cooldown: time.Hour})
		require.NoError(t, err)
		gate, circuit := lim.Gate("sk-capped", "capped"), brk.Circuit("sk-capped", "capped")
		est, err := estimator.New(nil)
		require.NoError(t, err)
		b := jobstest.New(t)
		limit := limiter.Limit{Rate: 100, Burst: 100, OutputTokensPerMinute: 16}
		sim := llmsim.New(llmsim.Config{})
		srv := httptest.NewServer(sim)
		t.Cleanup(srv.Close)
		p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-capped"})
		require.NoError(t, err)
		ex := executor.New(executor.Config{Store: b.Store, Estimator: est, Now: clock.Now, Upstreams: map[string]executor.Upstream{
			"capped": {Name: "capped", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate, Circuit: circuit,
				Limit: limit, PauseProbeInterval: probeEvery},
			"backup": {Name: "backup", Kind: string(llm.KindAnthropic), Provider: p}}})
		// A warm breaker; the credential paused, its first probe due; the token minute taken.
		a, err := circuit.Allow(ctx)
		require.NoError(t, err)
		_, err = circuit.Report(ctx, a, breaker.Success)
		require.NoError(t, err)
		_, err = gate.Pause(ctx, "rate_limited_no_retry_after", "first")
		require.NoError(t, err)
		clock.Advance(probeEvery)
		r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
		require.NoError(t, err)
		require.True(t, r.Granted)

		job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "capped", Fallbacks: []string{"backup"},
			Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
		require.NoError(t, err)
		var deferred *dispatch.DeferError
		require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
		require.Contains(t, deferred.Reason, "rate limit slot", "the probe's slot is held")

		// The slot is due; the credential's breaker is open: the job fails over.
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
		got, err := b.Store.Get(ctx, job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusSucceeded, got.Status)
		require.Equal(t, "backup", *got.AnsweredBy)

		pr, err := gate.TryProbe(ctx, probeEvery)
		require.NoError(t, err)
		require.True(t, pr.Granted(), "the probe held by the job that left was not given back: the next waits its interval")
	})
}

// cancelAfterHold is a serve process's in-process first delivery (dispatch.Handoff) of the real
// executor, whose job its owner cancels (the API's cancel: jobs.Store.Cancel, then
// dispatch.Tasks.AbortEnded) once the delivery has held its slot in the row and before it
// returns: the delivery's context ends by the abort's signal, which the Handoff takes for "the
// job was canceled".
type cancelAfterHold struct {
	ex    *executor.Executor
	store *jobs.Store
	tasks *dispatch.Tasks
	done  chan error // the cancel's outcome, once the abort reached the delivery
}

func (p *cancelAfterHold) AdmitFirst(ctx context.Context, job *jobs.Job) dispatch.Admission {
	return p.ex.AdmitFirst(ctx, job)
}

func (p *cancelAfterHold) ProcessFresh(ctx context.Context, job *jobs.Job, adm dispatch.Admission) error {
	err := p.ex.ProcessFresh(ctx, job, adm)
	p.done <- p.cancel(ctx, job.ID)
	return err
}

func (p *cancelAfterHold) cancel(ctx context.Context, id string) error {
	job, err := p.store.Cancel(context.WithoutCancel(ctx), id)
	if err != nil {
		return err
	}
	if job.SlotSeq == nil {
		return errors.New("the canceled job's row holds no slot: the delivery did not hold it")
	}
	// The Handoff's subscription to asynq's cancelation channel may not be in place yet: abort
	// until the signal has reached the delivery.
	bound := time.NewTimer(30 * time.Second)
	defer bound.Stop()
	for {
		if err := p.tasks.AbortEnded(job); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-bound.C:
			return errors.New("the abort did not reach the delivery")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// A serve process's in-process first delivery has no asynq task: when its owner cancels the job
// after the delivery held its slot in the row, and the abort's signal reaches the delivery before
// it returns its deferral, a task must still come back for the job, or nothing ever gives the
// slot back (AbortHeld finds no task to run; the Handoff handed nothing back for an aborted job).
func TestExecutor_HandedOverDeliveryCanceledAfterItsHoldGivesTheSlotBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := heldSetup(t, heldOpts{})
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	client, insp := asynq.NewClient(opt), asynq.NewInspector(opt)
	queue := redistest.Queue(t, redistest.URL())
	t.Cleanup(func() {
		require.NoError(t, insp.Close())
		require.NoError(t, client.Close())
	})
	enq := dispatch.NewEnqueuer(client, queue, nil)
	p := &cancelAfterHold{ex: u.ex, store: u.b.Store, tasks: dispatch.NewTasks(insp, enq), done: make(chan error, 1)}
	h := dispatch.NewHandoff(dispatch.HandoffConfig{Processor: p, Enqueuer: enq, Redis: redistest.Client(t)})
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- h.Run(runCtx) }()
	t.Cleanup(stop)

	job := u.b.Create(t, jobstest.Opts{Credential: "held", Timeout: time.Hour, Request: helloRequest})
	c := h.Claim(job.Priority, job.Lane)
	require.NotNil(t, c)
	c.Admit(ctx, job)
	c.Start(job)
	select {
	case err := <-p.done:
		require.NoError(t, err)
	case <-time.After(time.Minute): // past cancel's own bound on its aborts
		t.Fatal("the delivery did not end")
	}
	stop() // Run returns once the delivery has ended and its job, if it comes back, is handed back
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}

	_, err = insp.GetTaskInfo(queue, job.ID)
	require.NoError(t, err, "no task came back for the canceled job: nothing gives its held slot back")
	require.NoError(t, u.ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	require.Less(t, u.nextWait(t), heldMinute/2, "the canceled job's held slot still holds its tokens")
	got, err := u.b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Nil(t, got.SlotSeq)
	require.Zero(t, u.sim.Stats().Requests)
}

// A held slot's delivery whose attempt's start finds the job canceled meanwhile takes the slot
// from the row to give it back. When that take fails (Postgres unreachable a moment), the slot
// stays in the row, and only a later delivery can give it back: the delivery must come back
// (an error, asynq's retry), not end as done; no other task of the job is left to do it.
func TestExecutor_HeldSlotWhoseTakeFailedComesBack(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dbURL := pgtest.URL(t)
	pg, viaProxy := pgtest.NewProxy(t, dbURL)
	pool, err := pgxpool.New(ctx, viaProxy)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	store, owner := jobs.NewStore(pool, nil), jobs.NewStore(direct, nil)

	clock := clocktest.New(time.Now())
	rdb := redistest.Client(t)
	after := &afterNext{}
	rdb.AddHook(after)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: redistest.Prefix(t), Now: clock.Now, TokenMinute: heldMinute})
	require.NoError(t, err)
	gate := lim.Gate("sk-ended", "held")
	est, err := estimator.New(nil)
	require.NoError(t, err)
	limit := limiter.Limit{Rate: 100, Burst: 100, OutputTokensPerMinute: 16}
	sim := llmsim.New(llmsim.Config{})
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: llm.KindAnthropic, BaseURL: srv.URL, APIKey: "sk-ended"})
	require.NoError(t, err)
	ex := executor.New(executor.Config{Store: store, Estimator: est, Now: clock.Now, Upstreams: map[string]executor.Upstream{
		"held": {Name: "held", Kind: string(llm.KindAnthropic), Provider: p, Gate: gate, Limit: limit}}})
	r, err := gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
	require.NoError(t, err)
	require.True(t, r.Granted)

	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "held", Request: helloRequest,
		MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	var deferred *dispatch.DeferError
	require.ErrorAs(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}), &deferred)
	require.Contains(t, deferred.Reason, "rate limit slot")

	// The slot is due. The job is canceled once the delivery has read it (its first Redis call
	// is the limiter's clock, after the read), and Postgres drops the take's connection.
	clock.Advance(heldMinute)
	after.arm(func() {
		_, err := owner.Cancel(context.WithoutCancel(ctx), job.ID)
		require.NoError(t, err)
	})
	take := pg.HoldStatement("AND slot_seq = $2")
	done := make(chan error, 1)
	go func() { done <- ex.Process(ctx, dispatch.Delivery{JobID: job.ID}) }()
	select {
	case <-take.Reached():
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery did not try to take the ended job's slot")
	}
	pg.Cut()
	take.Release()
	var first error
	select {
	case first = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the delivery did not return")
	}
	pg.Restore()
	require.False(t, after.armed())
	require.Error(t, first, "the slot is still in the row, and the delivery that could give it back ended as done")

	// asynq's retry of the delivery gives the slot back.
	require.NoError(t, ex.Process(ctx, dispatch.Delivery{JobID: job.ID}))
	clock.Advance(heldMinute)
	r, err = gate.ReserveCost(ctx, limit, tokens.Cost{OutputTokens: 16})
	require.NoError(t, err)
	require.Less(t, r.Wait, heldMinute/2, "the canceled job's held slot still holds its tokens")
	got, err := owner.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Nil(t, got.SlotSeq)
	require.Zero(t, sim.Stats().Requests)
}
