package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// load reads the job. A job that does not exist or has ended needs nothing more (errHandled).
func (e *Executor) load(ctx context.Context, id string, fresh bool) (*jobs.Job, error) {
	start := e.cfg.Now()
	job, err := e.cfg.Store.Get(ctx, id)
	e.timed(StageLoad, start)
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		e.cfg.Logger.WarnContext(ctx, "task for a job that does not exist; dropping it", "job_id", id)
		return nil, errHandled
	case err != nil:
		return nil, err
	}
	if fresh && firstDelivery(job) {
		e.cfg.Metrics.stage(StagePickup, start.Sub(job.CreatedAt))
	}
	if job.Status.Terminal() {
		// A job that ended while it held a slot in its row (canceled, or failed by its deadline,
		// meanwhile) gives the slot back: its task is run at once for that (see
		// dispatch.Tasks.AbortHeld).
		if err := e.giveBackEnded(ctx, job); err != nil {
			return nil, err
		}
		return nil, errHandled
	}
	if job.Lane == jobs.LaneBatch {
		// A batch-lane job is the batcher's (internal/batchlane): a task for it is a stray.
		return nil, errHandled
	}
	return job, nil
}

// firstDelivery reports whether a fresh delivery (not dispatch's retry of one that failed on the
// stores) is the job's first: nothing attempted, deferred or failed over yet, and no event but
// its creation's (a dead job an operator retried is queued with no attempts again, days after
// its creation, and so is a batch-lane job sent online: neither is a pick-up).
func firstDelivery(job *jobs.Job) bool {
	return job.Status == jobs.StatusQueued && job.Attempts == 0 && job.NextAttemptAt == nil && job.CredentialIndex == 0 &&
		job.EventSeq == 1
}

// guard decides whether the job may go on to admission, and with which upstream: not while
// another delivery's attempt holds it, not past its deadline, not on a credential no longer
// configured, and not before its retry delay has passed (waited out here when short, after
// leaving the backlog gate). For a slot held in the row it returns the credential's pause
// state, read with the limiter's clock (see waitForAttempt), for admit's check; else nil.
func (e *Executor) guard(ctx context.Context, job *jobs.Job, pass *gatePass) (Upstream, *limiter.PauseState, error) {
	now := e.cfg.Now()
	if job.Leased(now) {
		// Another delivery's call is in flight (this one is a duplicate: a re-enqueue after
		// Redis lost the task, say). Look again soon: by then it may have finished the job or
		// handed it back (and, if this is the only task left, nothing else would run it).
		return Upstream{}, nil, leasedDefer(now, *job.LeaseUntil)
	}
	if !now.Before(job.Deadline) {
		err := e.end(ctx, job, nil, jobs.Outcome{Status: jobs.StatusFailed, LastError: &jobs.LastError{
			Class: jobs.ReasonDeadlineExceeded, Message: "job deadline passed before it could succeed",
		}})
		if errors.Is(err, errHandled) {
			// Ended (by this delivery or another's transition): a slot it held is not sent.
			if gerr := e.giveBackEnded(ctx, job); gerr != nil {
				return Upstream{}, nil, gerr
			}
		}
		return Upstream{}, nil, err
	}
	up, ok := e.cfg.Upstreams[job.CurrentCredential()]
	if !ok && e.newerConfigMayKnow(job, now) {
		// A rolling deploy that adds a credential: a process of the new config took the job
		// (after this one started, so its config is the newer) and this one's is stale. The
		// job waits for a process that knows the credential, as it would for a paused one.
		return Upstream{}, nil, &deferral{until: now.Add(e.spread(pausedRecheck)),
			reason:    fmt.Sprintf("credential %q is not in this process's config (a process of a newer config may know it)", job.CurrentCredential()),
			elsewhere: true}
	}
	if !ok && job.HasNextCredential() {
		// Configuration changed under a waiting job (or a dead letter retried at its own
		// credential after it was removed): its fallbacks take it, as they take a paused
		// credential's job. A fallback removed too is passed over in the same way.
		return Upstream{}, nil, e.failOver(ctx, job, &deferral{until: now.Add(leaseRecheck),
			reason: fmt.Sprintf("credential %q is no longer configured", job.CurrentCredential()), unavailable: true}, pass, nil)
	}
	if !ok {
		// Configuration changed under a queued job with no fallback left: nothing in this
		// config can send it until the credential is back (a mistake, a rename): a dead letter.
		return Upstream{}, nil, e.deadUnconfigured(ctx, job)
	}
	if job.NextAttemptAt == nil {
		return up, nil, nil
	}
	paused, err := e.waitForAttempt(ctx, job, up, pass)
	if err != nil {
		return Upstream{}, nil, err
	}
	return up, paused, nil
}

// waitForAttempt waits for the job's next attempt time (see waitUntil): a retry delay, on this
// process's clock; or a limiter slot held in the row (jobs.Store.HoldSlot), whose time is the
// limiter's (limiter.Reservation.SendAt, Redis's clock) and is waited for on it. The slot is not
// asked for again: measured on a local clock running ahead of Redis's, it would be sent early,
// into the provider's limit. The limiter's clock is read with the credential's pause state in
// one round trip (limiter.Gate.NowAndPaused), which it returns for admit's check of the held
// slot (nil for a retry delay): as a reservation's pause check is, it is the state before a
// short wait is slept out. A pause read before a sleep is not returned (nil): a reservation
// never acts on a pause read before its sleep either.
func (e *Executor) waitForAttempt(ctx context.Context, job *jobs.Job, up Upstream, pass *gatePass) (*limiter.PauseState, error) {
	if job.SlotSeq == nil || up.Gate == nil {
		if err := e.waitUntil(ctx, *job.NextAttemptAt, "retry delay", pass); err != nil {
			return nil, err
		}
		// A low job's delivery that slept takes a place in the backlog gate again for its
		// admission (not for a held slot's: its next step is the send).
		return nil, pass.rejoin(ctx)
	}
	now, paused, err := up.Gate.NowAndPaused(ctx)
	if err != nil {
		return nil, err
	}
	// The slot's time on this process's clock, as asynq (and the sleep) will measure it.
	if err := e.waitUntil(ctx, e.cfg.Now().Add(job.NextAttemptAt.Sub(now)), "rate limit slot", pass); err != nil {
		return nil, err
	}
	if paused.Paused && job.NextAttemptAt.After(now) {
		// Slept since the read: the pause may have ended meanwhile, and acted on as read it
		// would defer the slot, or move its job off a credential serving again. admit reads it
		// again (a round trip only on a paused credential, whose check makes more).
		return nil, nil
	}
	return &paused, nil
}

// unconfiguredAlertInterval is the least time between two alerts, across the workers, for the
// dead letters of one credential missing from the config: a config that lost it dead-letters
// every job on it, and the operator needs to hear of it once (and again while it lasts), not
// once a job.
const unconfiguredAlertInterval = 10 * time.Minute

// deadUnconfigured dead-letters job, whose credential and remaining fallbacks this process's
// config lacks (ReasonCredentialNotConfigured), and alerts (throttled per credential: see
// unconfiguredAlertInterval); its log line is throttled per credential too
// (Config.UnconfiguredLogInterval). Nothing is paused: there is no credential to pause. Restored to
// the config, the credential serves the job again once an operator retries it
// (ctl dead retry --reason credential_not_configured).
func (e *Executor) deadUnconfigured(ctx context.Context, job *jobs.Job) error {
	cred, reason := job.CurrentCredential(), jobs.ReasonCredentialNotConfigured
	err := e.end(ctx, job, nil, jobs.Outcome{Status: jobs.StatusDead, DeadReason: reason,
		LastError: &jobs.LastError{Class: string(retrypolicy.ClassPermanent),
			Message: fmt.Sprintf("credential %q is no longer configured", cred)}})
	if !errors.Is(err, errHandled) {
		return err
	}
	e.cfg.Alerter.Throttled(ctx, alert.Alert{Credential: cred, Reason: reason, JobID: job.ID,
		Message: fmt.Sprintf("credential %q is not in this worker's config (removed or renamed): its jobs are "+
			"dead-lettered; put it back in every worker's config, then run ctl dead retry --all --reason %s",
			cred, reason)}, unconfiguredAlertInterval)
	return errHandled
}

// RolloutGrace is how long after a job's creation a worker whose config lacks the job's credential
// leaves it to other processes, when the job was created after this worker started: another
// process's config, newer than this one's, accepted it (a rolling deploy that adds a
// credential). Past it, and for a job older than this worker (whose config then removed the
// credential), the job fails over to its fallbacks, or is dead-lettered
// (jobs.ReasonCredentialNotConfigured).
const RolloutGrace = 15 * time.Minute

// newerConfigMayKnow reports whether job, whose credential this process's config lacks, was
// created after this process started and within RolloutGrace (see RolloutGrace). Its creation is
// on Postgres's clock, compared with this host's: a skew of X moves both edges by X.
func (e *Executor) newerConfigMayKnow(job *jobs.Job, now time.Time) bool {
	return job.CreatedAt.After(e.started) && now.Sub(job.CreatedAt) < RolloutGrace
}

// leaseRecheck is how soon a delivery that found the job leased by another looks again. Not the
// lease's end: the holder usually finishes or hands the job back well before it, and when the
// holder's own task was lost (a Redis flush), this delivery's task is the only one left.
const leaseRecheck = 2 * time.Second

// leasedDefer defers a delivery that found the job's attempt leased until leaseUntil, or for
// leaseRecheck if that is sooner. The time is not written to the job row (stored): the row is
// the lease holder's, whose outcome sets its next attempt; written once the holder had released
// the lease, it would overwrite a longer retry delay (a Retry-After) with this recheck's.
func leasedDefer(now, leaseUntil time.Time) *deferral {
	return &deferral{until: minTime(leaseUntil, now.Add(leaseRecheck)), reason: "another delivery's attempt holds the job",
		stored: true}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// waitUntil sleeps until t when that is within MaxInlineWait (out of the backlog gate), else
// defers the delivery.
func (e *Executor) waitUntil(ctx context.Context, t time.Time, reason string, pass *gatePass) error {
	wait := t.Sub(e.cfg.Now())
	if wait <= 0 {
		return nil
	}
	if wait > e.cfg.MaxInlineWait {
		return &deferral{until: t, reason: reason, stored: true} // the row holds it
	}
	pass.leave()
	return sleep(ctx, wait)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// spread returns d plus U(0, d).
func (e *Executor) spread(d time.Duration) time.Duration {
	return d + time.Duration(e.cfg.Float64()*float64(d))
}
