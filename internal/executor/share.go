package executor

import (
	"context"
	"time"

	"github.com/llmq/llmq/internal/jobs"
)

// reasonOverShare is the reason of a delivery deferred because its tenant holds its share of the
// process's delivery slots (Config.Slots).
const reasonOverShare = "its tenant holds its share of this worker's delivery slots"

// takeShare takes one of the process's delivery slots in the share of the job's tenant
// (Config.Slots): took, the delivery holds it until its Release. It answers a *deferral when the
// tenant holds its share already: the job comes back after the tracker's delay, rounded up to a
// whole second (at its deadline at the latest), having taken no send slot and counted no attempt;
// the deferral is turnedAway, for Process's pause. A job past its deadline
// takes no slot and is not deferred: the guard fails it at once, as the delivery that finds it
// so would (deferred, it stayed queued past its deadline for as long as its tenant held its
// share). It errs when the tenant's weight cannot be read (the delivery fails on the store, as
// its lane's would).
func (e *Executor) takeShare(ctx context.Context, job *jobs.Job) (took bool, err error) {
	if !e.cfg.Now().Before(job.Deadline) {
		return false, nil
	}
	w, err := e.weight(ctx, job.Tenant)
	if err != nil {
		return false, err
	}
	single := e.cfg.SingleTenant != nil && e.cfg.SingleTenant()
	ok, delay := e.shares.Take(job.Tenant, w, single)
	if ok {
		return true, nil
	}
	e.cfg.Metrics.shareDeferred(job.Tenant)
	// The time is rounded up to a whole second: asynq keeps whole seconds (it delivers a task
	// at the start of its second), so the task comes back at the row's time or after it, never
	// before it to sleep out the rest in its slot. The delivery pauses (turnAwayPause) in
	// Process, once its deferral is written and its place in the backlog gate left.
	df := &deferral{until: minTime(ceilSecond(e.cfg.Now().Add(delay)), job.Deadline), reason: reasonOverShare,
		credential: job.CredentialIndex, read: true, turnedAway: true}
	if next := job.NextAttemptAt; next != nil && (job.SlotSeq != nil || next.After(df.until)) {
		// The row's time stands, and the job comes back at it at the earliest: a retry delay
		// not due yet (this delivery came back early, or is a second task of the job), written
		// over, let the retry go before its delay; a held send slot's time is on the limiter's
		// clock, and is postponed only once due (jobs.Store.Postpone), which the guard tells.
		df.until, df.stored = maxTime(df.until, *next), true
		if job.SlotSeq == nil {
			df.until = ceilSecond(df.until) // the row's time is not written: asynq's only
		}
	}
	return false, df
}

// ceilSecond is t rounded up to a whole second (t itself when whole).
func ceilSecond(t time.Time) time.Time {
	if s := t.Truncate(time.Second); !s.Equal(t) {
		return s.Add(time.Second)
	}
	return t
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// turnAwayPause is how long a delivery turned away for its tenant's share holds its slot after
// its deferral's write. The slots that turn a delivery away are the few free ones (the
// reserve), which meet an over-share tenant's backlog task after task: each turn away costs the
// job's read and its deferral's write, so a short pause keeps them from reading through a
// backlog in a hot loop (at most 1/turnAwayPause a slot), at the price of finding another
// tenant's task behind that backlog turnAwayPause a task later. The delivery holds no place
// in the backlog gate and no slot of a share meanwhile.
const turnAwayPause = 20 * time.Millisecond
