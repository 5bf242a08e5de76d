package executor

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tokens"
)

// admission is what the breaker and the limiter granted for one attempt.
type admission struct {
	breaker    *breaker.Admission  // nil: no breaker
	seq        int64               // the limiter slot, for Observe
	grant      int64               // the token reservation, for Reconcile (0: none)
	est        *estimator.Estimate // the estimate the grant was reserved with (nil: make it again)
	pauseProbe limiter.PauseProbe  // an automatic probe of a paused credential (zero: none)
	probe      bool                // the limiter's probe of a limit being learned
	reportSend int64               // a burst's slot: tell the gate when it leaves (limiter.Gate.Sent)
	held       bool                // the slot was held in the job row: its grant is the row's (see begin)
}

// errAskBreaker: the reservation's own test of the breaker (see clear) did not admit; the
// delivery asks the breaker first, as it would without that test.
var errAskBreaker = errors.New("the breaker is not plainly closed: ask it first")

// errSlotAfterDeadline: the send slot granted lies at or after the job's deadline (see admit).
var errSlotAfterDeadline = errors.New("send slot at or after the job's deadline")

// clear takes the breaker's admission and the attempt's send slot. The breaker decides first:
// while the provider is down, jobs wait without taking a rate slot or counting an attempt. An
// attempt with nothing to do before its reservation (no slot held from an earlier delivery, no
// draw on the retry budget) has the reservation's script make the breaker's test for admitting
// without writing (closed and warm, the usual case), saving the breaker's own round trip; in
// any other state, and on a paused credential, it asks the breaker itself (passBreaker), as the
// other attempts do. paused is the credential's pause state as guard read it for a slot held in
// the job row (nil: none read); it is read again after a wait for the breaker.
func (e *Executor) clear(ctx context.Context, job *jobs.Job, up Upstream, paused *limiter.PauseState, pass *gatePass) (admission, error) {
	t0 := e.cfg.Now()
	var lane laneMemo // the tenant's weight is read once per delivery
	if up.Circuit != nil && up.Gate != nil && job.SlotSeq == nil && (job.Attempts == 0 || !drawsOnRetryBudget(job)) {
		adm, err := e.admit(ctx, job, up, nil, nil, &lane, pass)
		if !errors.Is(err, errAskBreaker) {
			return adm, err
		}
	}
	// The breaker stage counts the declined test too.
	circuit, waited, err := e.passBreaker(ctx, job, up, pass, t0)
	if err != nil {
		return admission{}, err
	}
	if waited {
		paused = nil // read before the breaker's wait: admit reads it again
	}
	return e.admit(ctx, job, up, circuit, paused, &lane, pass)
}

// admit takes the attempt's send slot: the one an earlier delivery held in the job row, or a new
// one from the credential's gate (see admitGate). A request that can never fit the credential's
// token limits moves the job to its next fallback, or fails it on the last (failTooLarge); a
// refusal hands any breaker probe on and may fail the job over. With a credential's breaker but
// no circuit admission, the gate makes the breaker's test (see clear), and errAskBreaker says it
// did not admit. paused, when not nil, is the credential's pause state already read for the held
// slot (see guard).
func (e *Executor) admit(ctx context.Context, job *jobs.Job, up Upstream, circuit *breaker.Admission, paused *limiter.PauseState, lane *laneMemo, pass *gatePass) (admission, error) {
	adm := admission{breaker: circuit}
	switch {
	case job.SlotSeq != nil:
		// The slot (and its tokens) was taken by an earlier delivery and is due now: it goes,
		// unless the credential was paused since (each held slot went out, was refused and
		// dead-lettered its job); then it stays held until the resume, or the pause's probe (the
		// slot may be the probe's own: see admitGate).
		adm.seq, adm.held = *job.SlotSeq, true
		if job.SlotGrant != nil {
			adm.grant = *job.SlotGrant
		}
		if up.Gate == nil {
			return adm, nil
		}
		var err error
		if adm.pauseProbe, err = e.checkPause(ctx, up, paused, job.ID); err != nil {
			e.reportBreaker(ctx, up, circuit, breaker.Neutral) // not sent: hand a probe on
			// A job that leaves the credential leaves its slot: given back once the job has
			// moved, not before (a move that fails leaves the slot in the row, to be sent and
			// reconciled by the delivery that sends it; a grant is reconciled once).
			return adm, e.failOver(ctx, job, err, pass, func() { e.releaseSlot(ctx, up, adm) })
		}
		return adm, nil
	case up.Gate == nil:
		return adm, nil
	}
	t0 := e.cfg.Now()
	a, err := e.admitGate(ctx, job, up, circuit, lane, pass)
	if errors.Is(err, errAskBreaker) {
		return adm, err
	}
	e.timed(StageAdmit, t0)
	circuit = a.breaker // the gate's own test admitted it, or the one passed in
	adm.breaker = circuit
	if errors.Is(err, errSlotAfterDeadline) {
		return adm, e.failSlotAfterDeadline(ctx, job, up, a)
	}
	if errors.Is(err, tokens.ErrTooLarge) {
		e.reportBreaker(ctx, up, circuit, breaker.Neutral) // not sent: hand a probe on
		return adm, e.failTooLarge(ctx, job, up, a.est, err, pass)
	}
	if err != nil {
		e.reportBreaker(ctx, up, circuit, breaker.Neutral) // not sent: hand a probe on
		return adm, e.failOver(ctx, job, err, pass, nil)
	}
	adm.seq, adm.grant, adm.est, adm.pauseProbe, adm.reportSend = a.seq, a.grant, a.est, a.pauseProbe, a.reportSend
	adm.probe = a.probe
	return adm, nil
}

// reportSend tells the credential's gate that a burst's slot leaves now (limiter.Gate.Sent), so
// that the slots after the burst count the provider's refill from the burst's sends rather than
// from its grants. A failure only costs those slots a second's wait.
func (e *Executor) reportSend(ctx context.Context, up Upstream, adm admission) {
	if adm.reportSend == 0 || up.Gate == nil {
		return
	}
	if _, err := up.Gate.Sent(context.WithoutCancel(ctx), adm.reportSend); err != nil {
		e.cfg.Logger.WarnContext(ctx, "report a burst slot's send (the slots after the burst wait a second instead)",
			"credential", up.Name, "error", err)
	}
}

// admitGate asks the credential's shared gate whether and when this attempt may be sent: not
// while the credential is paused (unless this is the interval's probe), not past the retry
// budget, and at the send time of a rate-limiter slot. It sleeps short waits and returns a
// *deferral for long ones, holding the slot in the job row. A short wait is slept out of the
// backlog gate.
//
// A first attempt costs one Redis round trip: the breaker's test (circuit nil; see clear), the
// pause check and the count of first attempts (the retry budget's base) go in the reservation's
// script. A retry that draws on the budget checks the pause on its own first, so that a paused
// credential draws nothing. The admission returned holds the breaker's: circuit, or the one the
// gate's test made.
func (e *Executor) admitGate(ctx context.Context, job *jobs.Job, up Upstream, circuit *breaker.Admission, memo *laneMemo, pass *gatePass) (admission, error) {
	g := up.Gate
	adm := admission{breaker: circuit}
	opts := limiter.AttemptOptions{UnlessPaused: true, PauseDurable: e.cfg.Pauses != nil, FirstAttempt: job.Attempts == 0,
		ReportSend: true}
	if circuit == nil && up.Circuit != nil {
		opts.Circuit = circuitCheck(up)
	}
	lane, err := memo.get(ctx, e, job)
	if err != nil {
		return adm, err
	}
	opts.Lane = lane
	// Under fair queueing a retry may be told to come back for its turn many times: it draws on
	// the budget once its slot is granted, not at every ask (a refused draw leaves that slot
	// unused, as a canceled job would). It looks at the budget first (lookRetry): one the budget
	// would refuse takes no slot and leaves no ticket in its lane, where its place (its job's
	// creation time) would hold back every newer job of its tenant until the budget let it go.
	drawAfter := false
	if job.Attempts > 0 && drawsOnRetryBudget(job) {
		if adm.pauseProbe, err = e.checkPause(ctx, up, nil, ""); err != nil {
			return adm, err
		}
		opts.UnlessPaused = false
		switch {
		case adm.pauseProbe.Granted():
		case lane != nil:
			if err := e.lookRetry(ctx, job, g, lane); err != nil {
				return adm, err
			}
			drawAfter = true
		default:
			if err := e.drawRetry(ctx, job, g); err != nil {
				return adm, err
			}
		}
	}
	cost, est := e.cost(up, job)
	adm.est = est
	res, err := g.AcquireAttempt(ctx, up.Limit, cost, e.cfg.MaxInlineWait, opts)
	if err == nil && res.PauseUnknown {
		// Redis lost the pause state: restore it from Postgres, then ask again. (Lost once more
		// in between, the ask is refused again and the job looks again at once.)
		if _, err = e.restorePause(ctx, up); err == nil {
			res, err = g.AcquireAttempt(ctx, up.Limit, cost, e.cfg.MaxInlineWait, opts)
		}
	}
	if err == nil && opts.Circuit != nil && (res.CircuitRefused || res.Paused.Paused) {
		// A paused credential, too, goes the way it goes without the test: breaker first.
		return adm, errAskBreaker
	}
	if err == nil && opts.Circuit != nil && res.Granted {
		a := up.Circuit.ClosedAdmission(res.CircuitGen)
		adm.breaker = &a
	}
	if err == nil && res.Paused.Paused {
		if adm.pauseProbe, err = e.pauseProbe(ctx, up, res.Paused); err != nil {
			return adm, err
		}
		opts.UnlessPaused = false
		res, err = g.AcquireAttempt(ctx, up.Limit, cost, e.cfg.MaxInlineWait, opts)
	}
	// From here on, every way out but a send, or a slot held in the job row, gives back what was
	// granted (releaseSlot): a pause probe kept the credential's next one an interval away, a
	// limit's probe kept its other attempts waiting, and the tokens pushed later slots back.
	if err != nil {
		e.releaseSlot(ctx, up, adm)
		return adm, err
	}
	until := e.cfg.Now().Add(res.Wait)
	if !res.Granted {
		e.releaseSlot(ctx, up, adm)
		return adm, &deferral{until: until, reason: "waiting for a send slot (the job's turn, or the limit being learned)"}
	}
	adm.seq, adm.grant, adm.reportSend, adm.probe = res.Seq, res.Grant, res.ReportSend, res.Probe
	if drawAfter {
		if err := e.drawRetry(ctx, job, g); err != nil {
			e.releaseSlot(ctx, up, adm)
			return adm, err
		}
	}
	if !until.Before(job.Deadline) {
		return adm, errSlotAfterDeadline // admit releases it
	}
	if res.Wait > e.cfg.MaxInlineWait {
		// A pause probe's slot held for later keeps the probe: the interval's one attempt on the
		// paused credential is that slot's, which the pause's check of a held slot lets through.
		hctx, cancel := e.storeCtx(ctx)
		held, err := e.cfg.Store.HoldSlot(hctx, job.ID, res.SendAt, res.Seq, res.Grant)
		cancel()
		if err != nil || !held {
			// Not held (the job ended since its read, canceled say, or another delivery's
			// attempt holds it): nothing would ever send the slot, or give it back.
			e.releaseSlot(ctx, up, adm)
			if err == nil {
				err = e.notHeld(ctx, job.ID)
			}
			return adm, err
		}
		if err := g.HoldProbe(ctx, adm.pauseProbe, job.ID); err != nil {
			e.cfg.Logger.WarnContext(ctx, "hold a pause probe with its slot (the next probe waits its interval)",
				"credential", up.Name, "job_id", job.ID, "error", err)
		}
		return adm, &deferral{until: until, reason: "rate limit slot", stored: true}
	}
	pass.leave()
	if err := sleep(ctx, res.Wait); err != nil {
		// The job was canceled, or the worker is stopping, before its send time.
		e.releaseSlot(ctx, up, adm)
		return adm, err
	}
	return adm, nil
}

// failTooLarge ends the admission of a request that can never fit the credential's token limits
// (err, a *tokens.TooLargeError; est, when not nil, the estimate it was refused with): the job
// moves to its next fallback, whose key or provider may have larger limits (failOver), or fails
// unsent when none is left. The refusal reserved nothing (limiter.Gate.AcquireAttempt), and what
// admitGate held besides is already given back: the move has nothing to give back.
func (e *Executor) failTooLarge(ctx context.Context, job *jobs.Job, up Upstream,
	est *estimator.Estimate, err error, pass *gatePass) error {
	if job.HasNextCredential() {
		d := &deferral{until: e.cfg.Now(), unavailable: true,
			reason: "request too large for the credential's token limits: " + err.Error()}
		return e.failOver(ctx, job, d, pass, nil)
	}
	note := ""
	if est != nil {
		note = tokens.AssumedOutputNote(err, est.AssumedOutput, up.Kind)
	}
	return e.end(ctx, job, nil, jobs.Outcome{Status: jobs.StatusFailed, LastError: &jobs.LastError{
		Class:   string(retrypolicy.ClassPermanent),
		Message: "request can never be sent: " + err.Error() + note,
	}})
}

// failSlotAfterDeadline fails job, unsent, whose send slot (held in adm) comes at or after its
// deadline: the client learns it at once, and a job that cannot be sent does not sit queued
// until after its own deadline. What adm holds is given back (release).
func (e *Executor) failSlotAfterDeadline(ctx context.Context, job *jobs.Job, up Upstream, adm admission) error {
	e.release(ctx, up, adm)
	return e.end(ctx, job, nil, jobs.Outcome{Status: jobs.StatusFailed, LastError: &jobs.LastError{
		Class: jobs.ReasonDeadlineExceeded, Message: "the job's deadline passes before its send slot",
	}})
}

// release gives back what adm holds for an attempt that will not be sent: the breaker's
// admission (reported neutral: nothing was sent, so a breaker probe is handed on) and the
// limiter's grants (releaseSlot).
func (e *Executor) release(ctx context.Context, up Upstream, adm admission) {
	e.reportBreaker(ctx, up, adm.breaker, breaker.Neutral)
	e.releaseSlot(ctx, up, adm)
}

// releaseSlot gives back the limiter's grants in adm for an attempt that will not be sent (its
// job canceled, failed, deferred, or a store refusing its step before the call): the probe of a
// limit being learned (the credential's other attempts wait for its answer, which would
// otherwise come only when its hold, limiter.Config.ProbeTTL, runs out), the pause's automatic
// probe (the next would wait a whole Upstream.PauseProbeInterval), a burst slot's send report
// (the slots after the burst wait for it) and the reserved tokens (they push later slots back,
// and a far one holds the token horizon). Each grant ends so in a send or here. Failures are
// logged: they only cost the credential's other attempts those waits.
func (e *Executor) releaseSlot(ctx context.Context, up Upstream, adm admission) {
	if up.Gate == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	if adm.probe {
		// StatusCode 0, no headers: the answer to the probe is that there is none.
		if err := up.Gate.Observe(ctx, limiter.Observation{Seq: adm.seq}); err != nil {
			e.cfg.Logger.WarnContext(ctx, "release an unsent probe (the credential's other attempts wait for its hold to end)",
				"credential", up.Name, "error", err)
		}
	}
	if err := up.Gate.ReleaseProbe(ctx, adm.pauseProbe); err != nil {
		e.cfg.Logger.WarnContext(ctx, "release an unsent pause probe (the next waits its interval)", "credential", up.Name, "error", err)
	}
	e.reportSend(ctx, up, adm)
	if adm.grant != 0 {
		if err := up.Gate.Reconcile(ctx, adm.grant, tokens.Cost{}); err != nil {
			e.cfg.Logger.WarnContext(ctx, "refund the tokens of an unsent attempt", "credential", up.Name, "error", err)
		}
	}
}

// circuitCheck is up's breaker for the reservation's own test (limiter.AttemptOptions.Circuit).
func circuitCheck(up Upstream) *limiter.CircuitCheck {
	return &limiter.CircuitCheck{Key: up.Circuit.Key(), SuccessMemory: up.Circuit.SuccessMemory()}
}

// laneMemo keeps a delivery's lane (see lane) once read.
type laneMemo struct {
	lane *limiter.Lane
	read bool
}

// get returns the job's lane, reading it the first time.
func (m *laneMemo) get(ctx context.Context, e *Executor, job *jobs.Job) (*limiter.Lane, error) {
	if m.read {
		return m.lane, nil
	}
	l, err := e.lane(ctx, job)
	if err != nil {
		return nil, err
	}
	m.lane, m.read = l, true
	return l, nil
}

// lane is the job's fair-queueing lane on its credential (its tenant, the tenant's weight, its
// priority; its ID is its ticket, its creation time its place), or nil without
// Config.TenantWeight. A weight in the cache (Config.CachedTenantWeight) is taken without a
// bound: only a read from Postgres is bounded (Config.StoreTimeout), whose timer and context
// were made at every delivery for a read that, cached, waits for nothing.
func (e *Executor) lane(ctx context.Context, job *jobs.Job) (*limiter.Lane, error) {
	if e.cfg.TenantWeight == nil {
		return nil, nil
	}
	w, err := e.weight(ctx, job.Tenant)
	if err != nil {
		return nil, err
	}
	return laneOf(job, w), nil
}

// weight is the tenant's weight: from the cache when it has it, else read (bounded by
// StoreTimeout); 1 without Config.TenantWeight.
func (e *Executor) weight(ctx context.Context, tenant string) (int, error) {
	if e.cfg.TenantWeight == nil {
		return 1, nil
	}
	if e.cfg.CachedTenantWeight != nil {
		if w, ok := e.cfg.CachedTenantWeight(tenant); ok {
			return w, nil
		}
	}
	wctx, cancel := e.storeCtx(ctx)
	w, err := e.cfg.TenantWeight(wctx, tenant)
	cancel()
	return w, err
}

// laneOf is the job's fair-queueing lane with its tenant's weight w (see lane).
func laneOf(job *jobs.Job, w int) *limiter.Lane {
	p := limiter.PriorityNormal
	switch job.Priority {
	case jobs.PriorityHigh:
		p = limiter.PriorityHigh
	case jobs.PriorityLow:
		p = limiter.PriorityLow
	}
	return &limiter.Lane{Tenant: job.Tenant, Weight: w, Priority: p, Ticket: job.ID, Since: job.CreatedAt}
}

// checkPause reads the credential's pause state on its own (restoring one Redis lost, with
// Config.Pauses) for an attempt that does not reserve a slot with the pause check in the same
// script: nil error when not paused; when paused, pauseProbe's answer. known, when not nil, is
// the state already read (limiter.Gate.NowAndPaused): it is not read again. held is the job ID of
// a slot held in the job row ("" for none): when the pause's probe was granted with that slot
// (limiter.Gate.HoldProbe), it is this attempt's.
func (e *Executor) checkPause(ctx context.Context, up Upstream, known *limiter.PauseState, held string) (limiter.PauseProbe, error) {
	var ps limiter.PauseState
	var err error
	if known != nil {
		ps = *known
	} else {
		ps, err = up.Gate.Paused(ctx)
	}
	if err == nil && ps.Unknown && e.cfg.Pauses != nil {
		ps, err = e.restorePause(ctx, up)
	}
	if err != nil || !ps.Paused {
		return limiter.PauseProbe{}, err
	}
	if held != "" {
		if probe, err := up.Gate.ReclaimProbe(ctx, held); err != nil || probe.Granted() {
			return probe, err
		}
	}
	return e.pauseProbe(ctx, up, ps)
}

// pauseProbe answers an attempt on a paused credential: the automatic probe of the pause when
// it is this attempt's turn (one per PauseProbeInterval, cluster-wide), else a *deferral to look
// again.
func (e *Executor) pauseProbe(ctx context.Context, up Upstream, ps limiter.PauseState) (limiter.PauseProbe, error) {
	if up.PauseProbeInterval > 0 {
		probe, err := up.Gate.TryProbe(ctx, up.PauseProbeInterval)
		if err != nil || probe.Granted() {
			return probe, err
		}
	}
	recheck := pausedRecheck
	if up.PauseProbeInterval > 0 {
		recheck = min(recheck, up.PauseProbeInterval)
	}
	return limiter.PauseProbe{}, &deferral{until: e.cfg.Now().Add(e.spread(recheck)), reason: "credential paused: " + ps.Reason, unavailable: true}
}

// drawRetry asks the shared retry budget for the job's retry, or returns a *deferral when it is
// spent. Timeouts are the normal failure of long generations: they draw on their own budget. The
// retry is named by the job and its attempts so far, so that its deferrals (a look again each
// budgetRecheck) count one refusal, and its next retry, after another failure, one more; and so
// that it draws once, however often it is drawn before its send (its delivery back for a send
// slot far off, a draw whose reply was lost: limiter.Gate.AllowRetry).
func (e *Executor) drawRetry(ctx context.Context, job *jobs.Job, g *limiter.Gate) error {
	allow := g.AllowRetry
	if retryAfterTimeout(job) {
		allow = g.AllowTimeoutRetry
	}
	ok, err := allow(ctx, retryName(job))
	return e.budgetAnswer(job, ok, err)
}

// lookRetry is drawRetry's look for a retry in its fair-queueing lane, which draws only once its
// slot is granted (limiter.Gate.RetryAllowed): nil says the draw would be allowed now, and
// spends nothing; a refusal is drawRetry's deferral (and the same one refusal of the retry), and
// takes the retry's ticket out of lane, so that the jobs behind it in its lane go.
func (e *Executor) lookRetry(ctx context.Context, job *jobs.Job, g *limiter.Gate, lane *limiter.Lane) error {
	allowed := g.RetryAllowed
	if retryAfterTimeout(job) {
		allowed = g.TimeoutRetryAllowed
	}
	ok, err := allowed(ctx, retryName(job), lane)
	return e.budgetAnswer(job, ok, err)
}

// retryAfterTimeout reports whether the job's retry draws on the timeouts' allowance.
func retryAfterTimeout(job *jobs.Job) bool {
	return job.LastError != nil && job.LastError.Class == string(retrypolicy.ClassTimeout)
}

// retryName names the job's next retry to the budget: its job and its attempts so far.
func retryName(job *jobs.Job) string { return job.ID + ":" + strconv.Itoa(job.Attempts) }

// budgetAnswer is the delivery's way on after the budget's answer ok (or err) for job's retry:
// nil when allowed, else a *deferral to look again.
func (e *Executor) budgetAnswer(job *jobs.Job, ok bool, err error) error {
	if err != nil {
		return err
	}
	if ok {
		return nil
	}
	budget := "retry budget spent"
	if retryAfterTimeout(job) {
		budget = "timeout retry budget spent"
	}
	return &deferral{until: e.cfg.Now().Add(e.spread(budgetRecheck)), reason: budget}
}

// drawsOnRetryBudget reports whether the job's next attempt is a retry the shared retry budget
// must allow. Three kinds are not: a retry after a 429 with Retry-After (the limiter paces it: the
// answer pushed the credential's whole schedule back), a re-attempt of a call the provider did
// not fail (the job is still running, its lease ended: its worker died before recording the
// outcome; or retrying with class canceled: its call was cut as its worker stopped, or it was
// lost and moved while its credential could not take it, jobs.Store.WaitForCredential), and the
// first attempt on a fallback the job moved to after its credential refused the request as too
// large or answered with a spend cap (movedForSizeOrSpendCap: neither is a failing provider, and
// the fallback has not failed the job). Charging those let a Redis flush or
// a worker crash hold recovered jobs back for minutes behind a budget meant to stop retry storms
// against a failing provider.
func drawsOnRetryBudget(job *jobs.Job) bool {
	if job.Status == jobs.StatusRunning || movedForSizeOrSpendCap(job) ||
		job.Status == jobs.StatusRetrying && job.LastError != nil && job.LastError.Class == string(retrypolicy.ClassCanceled) {
		return false
	}
	return job.LastError == nil || job.LastError.Class != string(retrypolicy.ClassRateLimited)
}

// movedForSizeOrSpendCap reports whether the waiting job's last attempt failed it over for a
// size refusal or a spend cap. Its last error tells: a permanent or spend-cap class ends the job
// (failed, dead) unless it fails over (the size refusal's class is permanent), so a job still
// retrying with one was moved for it. A dead letter an operator retries is queued, not retrying.
func movedForSizeOrSpendCap(job *jobs.Job) bool {
	if job.Status != jobs.StatusRetrying || job.LastError == nil {
		return false
	}
	c := retrypolicy.Class(job.LastError.Class)
	return c == retrypolicy.ClassPermanent || c == retrypolicy.ClassSpendCap
}

// cost is the job's estimated tokens for the token buckets, and the estimate behind it (zero and
// nil without an estimator, or for a body the estimator cannot read: the provider judges that one).
func (e *Executor) cost(up Upstream, job *jobs.Job) (tokens.Cost, *estimator.Estimate) {
	if e.cfg.Estimator == nil {
		return tokens.Cost{}, nil
	}
	est, err := e.cfg.Estimator.Estimate(up.Name, job.Tenant, up.Kind, job.Request)
	if err != nil {
		return tokens.Cost{}, nil
	}
	return tokens.Cost{InputTokens: est.Input, OutputTokens: est.MaxOutput, MinInputTokens: est.MinRaw}, &est
}

// notHeld is how a delivery ends whose slot the job row refused (jobs.Store.HoldSlot answered
// held=false; the slot is already given back). The refusal does not say why, so the row is read
// again, on this rare path only: a job that ended (canceled, failed by its deadline, finished by
// another delivery) needs nothing more (errHandled); a job another delivery's attempt holds is
// deferred as the guard defers it (leasedDefer), for this delivery's task may be the only one
// left (a duplicate's, its holder's task lost) and, ended as done, it left the job to the
// sweeper; a job whose lease ended between the two reads is looked at again at once, its row's
// own next attempt time (a retry delay just recorded, say) kept.
func (e *Executor) notHeld(ctx context.Context, id string) error {
	job, err := e.cfg.Store.Get(ctx, id)
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		return errHandled
	case err != nil:
		return fmt.Errorf("read a job whose row refused its slot: %w", err)
	case job.Status.Terminal():
		return errHandled
	}
	now := e.cfg.Now()
	if job.Leased(now) {
		return leasedDefer(now, *job.LeaseUntil)
	}
	return &deferral{until: now, reason: "the job's attempt ended as its slot was held", stored: true}
}
