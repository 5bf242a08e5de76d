package executor

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// passBreaker asks the credential's circuit whether the job may go. The breaker comes first:
// while the provider is down, jobs wait without taking a rate slot or counting an attempt, and
// after the cooldown exactly one probe goes out cluster-wide. It returns the admission to report
// the call's outcome on (nil without a circuit), or a *deferral (or the fallback's outcome, see
// failOver) when refused. Its stage is timed from t0. waited reports that the delivery waited
// for the breaker (see allowBreaker).
func (e *Executor) passBreaker(ctx context.Context, job *jobs.Job, up Upstream, pass *gatePass, t0 time.Time) (_ *breaker.Admission, waited bool, _ error) {
	if up.Circuit == nil {
		return nil, false, nil
	}
	a, waited, err := e.allowBreaker(ctx, job, up, pass)
	e.timed(StageBreaker, t0)
	if err != nil {
		return nil, waited, err
	}
	if !a.Allowed {
		reason := "circuit " + string(a.State)
		if a.Capped {
			// A cold credential waiting for its first answer is not known to be down: wait on
			// it rather than fail over.
			reason = "circuit cold start: waiting for a first answer"
		}
		return nil, waited, e.failOver(ctx, job, &deferral{until: e.cfg.Now().Add(a.Wait), reason: reason, unavailable: !a.Capped}, pass,
			func() { e.releaseHeld(ctx, job, up) })
	}
	return &a, waited, nil
}

// releaseHeld gives back the slot held in the row of job, which has left up's credential (see
// failOver) or ended (giveBackEnded): its row no longer holds it, and nothing else would refund
// its tokens. A pause probe held with the slot (limiter.Gate.HoldProbe) goes back with it: kept,
// it held the credential's next probe back for an interval (one Redis round trip, on these
// paths only). A job holding none gives back nothing.
func (e *Executor) releaseHeld(ctx context.Context, job *jobs.Job, up Upstream) {
	if job.SlotSeq == nil || up.Gate == nil {
		return
	}
	adm := admission{seq: *job.SlotSeq, held: true}
	if job.SlotGrant != nil {
		adm.grant = *job.SlotGrant
	}
	e.releaseSlot(ctx, up, adm)
	if err := up.Gate.ReleaseHeldProbe(context.WithoutCancel(ctx), job.ID); err != nil {
		e.cfg.Logger.WarnContext(ctx, "release a held pause probe (the next waits its interval)", "credential", up.Name,
			"job_id", job.ID, "error", err)
	}
}

// giveBackEnded gives back the slot that job, which has ended, still holds in its row (see
// jobs.Store.TakeEndedSlot: canceled or failed by its deadline while it waited for the slot),
// with a pause probe held with it: once, by the delivery whose take clears the row. A job that
// holds none, or whose credential is gone, costs nothing. It returns the store's error (the
// delivery is retried, and gives it back then).
func (e *Executor) giveBackEnded(ctx context.Context, job *jobs.Job) error {
	if job.SlotSeq == nil {
		return nil
	}
	up, ok := e.cfg.Upstreams[job.CurrentCredential()]
	if !ok || up.Gate == nil {
		return nil
	}
	tctx, cancel := e.storeCtx(context.WithoutCancel(ctx))
	took, err := e.cfg.Store.TakeEndedSlot(tctx, job.ID, *job.SlotSeq)
	cancel()
	if err != nil || !took {
		return err
	}
	e.releaseHeld(ctx, job, up)
	return nil
}

// allowBreaker asks the credential's circuit. A refused job due back within MaxInlineWait (the
// cooldown ends soon, a probe or the cold-start cap's requests are out) waits here instead of
// going back to the queue, and asks again as soon as a probe or cold-start request reports (see
// breaker.Listen) or its wait ends: the probe goes at the cooldown's end, and when it closes the
// breaker the waiting jobs go at once, not a re-check later. A job with a fallback left is not
// held on an open or half-open breaker: failOver moves it on at once. The wait is out of the
// backlog gate; a low job's delivery takes a place again before it asks again. waited reports
// that it waited.
func (e *Executor) allowBreaker(ctx context.Context, job *jobs.Job, up Upstream, pass *gatePass) (_ breaker.Admission, waited bool, _ error) {
	deadline := e.cfg.Now().Add(e.cfg.MaxInlineWait)
	for {
		wake := up.Circuit.Wakeup()
		a, err := up.Circuit.Allow(ctx)
		if err != nil || a.Allowed || (!a.Capped && job.HasNextCredential()) {
			return a, waited, err
		}
		if e.cfg.Now().Add(a.Wait).After(deadline) {
			return a, waited, nil
		}
		pass.leave()
		waited = true
		if err := breaker.Await(ctx, wake, a.Wait); err != nil {
			return breaker.Admission{}, waited, err
		}
		if err := pass.rejoin(ctx); err != nil {
			return breaker.Admission{}, waited, err
		}
	}
}

// failOver moves a job whose credential cannot take requests now (breaker open, paused), or
// cannot ever take this one (too large for its token limits: failTooLarge), to its next
// fallback at once, and runs the delivery again there, instead of waiting for the
// credential to heal: sequential waiting is what makes failover slow. Other errors, and jobs
// without a fallback left, pass through. The delivery there keeps this one's pass in the
// backlog gate. left, when not nil, runs once the job has moved (and only then): what the job
// held on the credential it left is given back there. The move is from the credential job was
// read on: when another delivery of the job moved it first, this one moves nothing (two
// deliveries skip no fallback, and a held slot is given back once) and defers. Each move
// advances the job's chain, so one delivery moves at most once per fallback; its moves are
// logged in one line.
func (e *Executor) failOver(ctx context.Context, job *jobs.Job, err error, pass *gatePass, left func()) error {
	var d *deferral
	if !errors.As(err, &d) || !d.unavailable || !job.HasNextCredential() {
		return err
	}
	mctx, cancel := e.storeCtx(ctx)
	moved, merr := e.cfg.Store.NextCredential(mctx, job.ID, job.CredentialIndex)
	cancel()
	if merr != nil {
		return merr
	}
	if !moved {
		// The job is no longer this delivery's to move: another delivery moved it on first (or
		// ended it, or its attempt is leased). The row is that one's: this delivery comes back
		// at its deferral's time without writing the left credential's recheck over it.
		stay := *d
		stay.stored = true
		return &stay
	}
	if left != nil {
		left()
	}
	// The moves of one delivery (a chain of credentials too small, say) are logged in one line
	// (the chain's length in lines per job would flood the log): by run once a credential
	// admits the attempt, before the call (which may last minutes, or never end in a worker
	// that dies), or here by the first move when the delivery ended unsent.
	first := len(pass.movedFrom) == 0
	if first {
		pass.moveReason = d.reason
	}
	pass.movedFrom = append(pass.movedFrom, job.CurrentCredential())
	// The delivery there runs in the slot this one holds (an asynq delivery's in its tenant's
	// share, or a serve process's own): it takes no second one.
	err = e.process(ctx, job.ID, false, pass, false)
	if first {
		e.logMoves(ctx, job.ID, pass)
	}
	if err != nil {
		return err
	}
	return errHandled
}

// logMoves logs the moves of job id's delivery not logged yet (pass.movedFrom), in one line
// naming the credential it left first and why, and forgets them.
func (e *Executor) logMoves(ctx context.Context, id string, pass *gatePass) {
	n := len(pass.movedFrom)
	if n == 0 {
		return
	}
	attrs := []any{"job_id", id, "from", pass.movedFrom[0], "reason", pass.moveReason}
	if n > 1 {
		attrs = append(attrs, "left", strings.Join(pass.movedFrom, ","), "moves", n)
	}
	e.cfg.Logger.InfoContext(ctx, "failing over", attrs...)
	pass.movedFrom, pass.moveReason = nil, ""
}

// reportBreaker tells the circuit how an admitted call went. Errors are logged: the breaker's
// bookkeeping must not decide the job's outcome.
func (e *Executor) reportBreaker(ctx context.Context, up Upstream, a *breaker.Admission, o breaker.Outcome) {
	if a == nil {
		return
	}
	if _, err := up.Circuit.Report(context.WithoutCancel(ctx), *a, o); err != nil {
		e.cfg.Logger.WarnContext(ctx, "breaker report", "credential", up.Name, "error", err)
	}
}

// breakerOutcome says whether an attempt's class is a server-side failure (it counts toward
// opening the breaker), a success, or neither (our request's fault, rate limits, cancellation).
func breakerOutcome(d retrypolicy.Decision) breaker.Outcome {
	switch d.Class {
	case retrypolicy.ClassOK:
		return breaker.Success
	case retrypolicy.ClassTimeout, retrypolicy.ClassNetwork:
		return breaker.Failure
	case retrypolicy.ClassRetryable:
		if d.StatusCode >= 500 {
			return breaker.Failure
		}
	}
	return breaker.Neutral
}
