package executor

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/gostack"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
)

// beginWithin is how soon a slot admitted before its job exists must be due for the job to be
// created with its attempt started (FirstAdmission.Begin): about the create's own commit, so
// that the "running" event does not come noticeably before the call.
const beginWithin = 2 * time.Millisecond

// firstAdmitTimeout bounds AdmitFirst's wait for Redis (well under a millisecond when Redis is
// well): a submit does not wait on a Redis that does not answer, nor hold its insert
// transaction's connection meanwhile. Past it the job is created without an admission, and an
// admission that comes later is released. (The Redis clients' reads keep their own timeout,
// seconds, whatever the context says: go-redis's ContextTimeoutEnabled is off.)
const firstAdmitTimeout = 200 * time.Millisecond

// FirstAdmission is a new job's first attempt admitted before the job was created
// (AdmitFirst): the credential's rate-limit slot and the breaker's admission, held for the
// delivery that runs the job (ProcessFresh). It implements dispatch.Admission.
type FirstAdmission struct {
	e      *Executor
	up     Upstream
	adm    admission
	sendAt time.Time   // when the slot is due, on this process's clock
	slotAt time.Time   // the same on the limiter's clock (Reservation.SendAt): what the row holds
	begin  *jobs.Begin // nil: the slot is not due within beginWithin
}

// Begin is the attempt's start to create the job with, when the slot is due at once (nil: the
// job is created queued; ProcessFresh starts the attempt when the slot is due).
func (a *FirstAdmission) Begin() *jobs.Begin { return a.begin }

// Release gives back what an admission for a job that was never created holds: the breaker's
// admission (neutral: nothing was sent), the probe of a limit being learned, the reserved
// tokens, and a burst slot's send report (so the slots after the burst do not wait for it).
func (a *FirstAdmission) Release(ctx context.Context) {
	a.e.release(ctx, a.up, a.adm)
}

// AdmitFirst asks for the first attempt of job, a job about to be created (jobs.Store.Prepare's)
// whose first delivery runs in this process (dispatch.Handoff), in one Redis round trip and
// without waiting: the breaker's test and the credential's rate slot, as a first delivery's
// admission does. It returns nil, and the delivery admits the attempt as any other, unless a
// slot was granted outright: not for a low job, a job on a credential with a breaker and no
// limiter (or the reverse), a paused or not plainly closed credential, a tenant whose weight is
// not cached (see Config.CachedTenantWeight), a turn not yet come, a request too large for the
// limits, or a failure of Redis. So the job's insert can take the attempt's start with it,
// sparing the delivery a statement and a commit (docs/decisions.md). It never reads Postgres:
// it runs inside the insert's transaction (jobs.CreateParams.Admit), whose connection it would
// otherwise wait on with the pool's others.
func (e *Executor) AdmitFirst(ctx context.Context, job *jobs.Job) dispatch.Admission {
	if job.Priority == jobs.PriorityLow || !e.cfg.Now().Before(job.Deadline) {
		return nil
	}
	up, ok := e.cfg.Upstreams[job.CurrentCredential()]
	if !ok {
		return nil
	}
	a := &FirstAdmission{e: e, up: up}
	switch {
	case up.Gate == nil && up.Circuit == nil:
		a.sendAt = e.cfg.Now()
	case up.Gate == nil || up.Circuit == nil:
		return nil
	default:
		if !e.reserveFirstWithin(ctx, job, up, a) {
			return nil
		}
	}
	if a.sendAt.Sub(e.cfg.Now()) <= beginWithin && a.sendAt.Before(job.Deadline) {
		a.begin = &jobs.Begin{LeaseToken: uuid.NewString()}
	}
	return a
}

// reserveFirstWithin is reserveFirst bounded by firstAdmitTimeout; it reports whether a slot
// was granted in time. The ask runs on, detached, past the bound, and releases what it took.
func (e *Executor) reserveFirstWithin(ctx context.Context, job *jobs.Job, up Upstream, a *FirstAdmission) bool {
	type answer struct {
		granted bool
		err     error
	}
	t0 := e.cfg.Now()
	ch := make(chan answer, 1)
	rctx := context.WithoutCancel(ctx) // a late answer is still released, whatever the submit's fate
	go func() {
		gostack.Grow()
		granted, err := e.reserveFirst(rctx, job, up, a)
		ch <- answer{granted, err}
	}()
	timer := time.NewTimer(firstAdmitTimeout)
	defer timer.Stop()
	select {
	case r := <-ch:
		e.timed(StageAdmit, t0)
		if r.err != nil {
			e.cfg.Logger.WarnContext(ctx, "admit a new job's first attempt (its delivery asks again)", "job_id", job.ID, "error", r.err)
		}
		return r.granted
	case <-timer.C:
		e.cfg.Logger.WarnContext(ctx, "admit a new job's first attempt: Redis did not answer in time (its delivery asks again)",
			"job_id", job.ID, "timeout", firstAdmitTimeout)
		go func() {
			if r := <-ch; r.granted {
				a.Release(rctx)
			}
		}()
		return false
	}
}

// reserveFirst is AdmitFirst's one ask of the credential's gate, with the breaker's test, the
// pause check and the fair-queueing lane in the reservation's script (see admitGate). It
// reports whether a slot was granted, and fills a with it.
func (e *Executor) reserveFirst(ctx context.Context, job *jobs.Job, up Upstream, a *FirstAdmission) (bool, error) {
	var lane *limiter.Lane
	if e.cfg.TenantWeight != nil {
		if e.cfg.CachedTenantWeight == nil {
			return false, nil
		}
		w, ok := e.cfg.CachedTenantWeight(job.Tenant)
		if !ok {
			return false, nil
		}
		lane = laneOf(job, w)
	}
	cost, est := e.cost(up, job)
	res, err := up.Gate.ReserveAttempt(ctx, up.Limit, cost, limiter.AttemptOptions{
		UnlessPaused: true, PauseDurable: e.cfg.Pauses != nil, FirstAttempt: true, ReportSend: true, Lane: lane,
		Circuit: circuitCheck(up),
	})
	if err != nil || !res.Granted || res.CircuitRefused || res.Paused.Paused {
		return false, err
	}
	circuit := up.Circuit.ClosedAdmission(res.CircuitGen)
	a.adm = admission{breaker: &circuit, seq: res.Seq, grant: res.Grant, est: est, reportSend: res.ReportSend, probe: res.Probe}
	a.sendAt, a.slotAt = e.cfg.Now().Add(res.Wait), res.SendAt
	return true, nil
}

// runAdmitted is a handed-over delivery with its first attempt admitted before the job was
// created (see AdmitFirst): the job was created with the attempt started, or its slot is due
// later (slept out within MaxInlineWait, else held in the row and the delivery deferred).
func (e *Executor) runAdmitted(ctx context.Context, job *jobs.Job, a *FirstAdmission) error {
	begun := job.Status == jobs.StatusRunning // the insert started the attempt
	if !begun && !a.sendAt.Before(job.Deadline) {
		return e.failSlotAfterDeadline(ctx, job, a.up, a.adm)
	}
	if !begun && a.sendAt.Sub(e.cfg.Now()) > e.cfg.MaxInlineWait {
		e.reportBreaker(ctx, a.up, a.adm.breaker, breaker.Neutral)
		hctx, cancel := e.storeCtx(ctx)
		held, err := e.cfg.Store.HoldSlot(hctx, job.ID, a.slotAt, a.adm.seq, a.adm.grant)
		cancel()
		if err != nil || !held {
			// Not held: the job was canceled since its create, or (rarely: a task the sweeper
			// enqueued for a delivery that stalled) another delivery's attempt holds it.
			e.releaseSlot(ctx, a.up, a.adm)
			if err == nil {
				return e.notHeld(ctx, job.ID)
			}
			return err
		}
		return &deferral{until: a.sendAt, reason: "rate limit slot", stored: true}
	}
	if err := sleep(ctx, a.sendAt.Sub(e.cfg.Now())); err != nil {
		e.release(ctx, a.up, a.adm)
		return err
	}
	if !begun {
		started, err := e.begin(ctx, job, a.up, a.adm)
		if err != nil {
			return err
		}
		job = started
	}
	return e.attempt(ctx, job, a.up, a.adm)
}
