package executor

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
)

// end moves the job to a terminal outcome and returns errHandled, or the store's error. Writes
// survive the delivery's cancellation, bounded by record's own window (Config.RecordRetryWindow).
func (e *Executor) end(ctx context.Context, job *jobs.Job, a *jobs.Attempt, o jobs.Outcome) error {
	applied, err := e.record(context.WithoutCancel(ctx), job.ID, a, o)
	if err != nil {
		return err
	}
	if !applied {
		return errHandled
	}
	e.cfg.Metrics.Finished(job.Credential, o.Status, o.DeadReason, e.cfg.Now().Sub(job.CreatedAt))
	e.logEnd(ctx, job, o)
	e.endStream(ctx, job)
	return errHandled
}

// endStream shortens a streaming job's delta buffer's life once the job ended
// (deltastream.Buffer.End: a minute by default, where it was kept for the buffer's whole TTL).
// Best effort, bounded by a second: the buffer expires at its TTL anyway.
func (e *Executor) endStream(ctx context.Context, job *jobs.Job) {
	if e.cfg.Deltas == nil || !deltastream.Requested(job.Request) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_ = e.cfg.Deltas.End(ctx, job.ID)
}

// logEnd logs a job's end: an error when it is dead-lettered, a warning when it failed, else a
// debug line, whose attributes are built only when that level is on (at every job
// they boxed its id, credential and status and made their slice, for a line the default level
// drops).
func (e *Executor) logEnd(ctx context.Context, job *jobs.Job, o jobs.Outcome) {
	warned := o.Status == jobs.StatusDead || o.Status == jobs.StatusFailed
	if !warned && !e.cfg.Logger.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := []any{"job_id", job.ID, "credential", job.Credential, "status", o.Status, "attempts", job.Attempts}
	switch o.Status {
	case jobs.StatusDead:
		attrs = append(attrs, "reason", o.DeadReason, "class", o.LastError.Class)
		if o.DeadReason == jobs.ReasonCredentialNotConfigured {
			cred := job.CurrentCredential()
			log, suppressed := e.unconfiguredLog.AllowAt(cred, slog.LevelError, attrs...)
			if !log {
				return
			}
			if suppressed > 0 {
				attrs = append(attrs, "suppressed", suppressed)
			}
		}
		e.cfg.Logger.ErrorContext(ctx, msgDeadLettered, attrs...)
	case jobs.StatusFailed:
		e.cfg.Logger.WarnContext(ctx, "job failed", append(attrs, "class", o.LastError.Class)...)
	default:
		e.cfg.Logger.DebugContext(ctx, "job finished", attrs...)
	}
}

// msgDeadLettered is the message of a dead letter's line, which the report of those held back
// (unconfiguredSuppressed) repeats.
const msgDeadLettered = "job dead-lettered"

// unconfiguredSuppressed logs the lines of a credential's credential_not_configured dead letters
// held back and counted in no line since (unconfiguredLog's Report), with the attributes of the
// last of them: the end of a flood that no dead letter followed.
func (e *Executor) unconfiguredSuppressed(_ string, _ slog.Level, suppressed int, last []any) {
	e.cfg.Logger.Error(msgDeadLettered, append(slices.Clip(last), "suppressed", suppressed)...)
}

// DefaultRecordRetryWindow is Config.RecordRetryWindow's default: how long record keeps trying
// while Postgres cannot be reached.
const DefaultRecordRetryWindow = 30 * time.Second

// record stores an attempt's outcome (jobs.Store.Finish), timed as StageRecord, retries included.
// While Postgres cannot be reached it tries again, backing off from 50 ms to 1 s, for up to
// Config.RecordRetryWindow (or until ctx ends), and returns the last error only then (an answer
// given up is logged: logDropped). The call has been made and paid for: handing the delivery back
// to asynq instead would leave the job's lease to run out and the call to be made again. Finish
// is safe to run again (a terminal outcome already stored answers applied=false). After a try
// that waited for the job's locked row past its bound, the next go out beside the store's
// batches (jobs.Alone): in one, each held every transition of the process queued behind it for
// that bound.
func (e *Executor) record(ctx context.Context, id string, a *jobs.Attempt, o jobs.Outcome) (bool, error) {
	defer e.timed(StageRecord, e.cfg.Now())
	ctx, cancel := context.WithTimeout(ctx, e.cfg.RecordRetryWindow)
	defer cancel()
	wait := 50 * time.Millisecond
	for tries := 1; ; tries++ {
		applied, err := e.cfg.Store.Finish(ctx, id, a, o)
		if err == nil || !jobs.IsUnavailable(err) || ctx.Err() != nil {
			if err == nil && tries > 1 {
				e.cfg.Logger.InfoContext(ctx, "attempt outcome recorded after postgres came back", "job_id", id, "tries", tries)
			}
			if err != nil {
				e.logDropped(ctx, id, a, o, tries, err)
			}
			return applied, err
		}
		if tries == 1 {
			e.cfg.Logger.WarnContext(ctx, "postgres unavailable while recording an attempt's outcome; trying again",
				"job_id", id, "error", err)
		}
		if jobs.IsLockTimeout(err) {
			// The job's row is locked (a stalled session's transaction): the next tries may
			// wait for it as long, and do so beside the process's batches, not in one.
			ctx = jobs.Alone(ctx)
		}
		if sleep(ctx, wait) != nil {
			e.logDropped(ctx, id, a, o, tries, err)
			return false, err
		}
		wait = min(2*wait, time.Second)
	}
}

// logDropped logs, at error level, a provider's answer that record gave up storing (err, after
// tries): a later delivery of the job may call the provider again, paying twice. Only an answer is
// logged (a succeeded outcome of an attempt); a failure's outcome lost the same way shows in the
// delivery-failure metric.
func (e *Executor) logDropped(ctx context.Context, id string, a *jobs.Attempt, o jobs.Outcome, tries int, err error) {
	if a == nil || o.Status != jobs.StatusSucceeded {
		return
	}
	attrs := []any{"job_id", id, "attempt", a.Number, "credential", a.Credential, "tries", tries, "error", err}
	if o.Usage != nil {
		attrs = append(attrs, "usage", o.Usage)
	}
	e.cfg.Logger.ErrorContext(ctx, "paid answer dropped: its outcome could not be recorded; a later delivery may call the provider again", attrs...)
}

// keepLease renews the attempt's lease (jobs.Store.RenewLease) every Config.LeaseRenewInterval until the
// returned keeper's stop is called, so that a long call keeps other deliveries of the job waiting
// while a dead one frees the job within jobs.AttemptLease; lost (when not nil) is called with
// errLeaseLost once a renewal finds the job moved on without the attempt (canceled, or its lease
// taken over by another delivery). Stop lets a renewal under way finish (or reach its own
// deadline, jobs.AttemptLease) before it returns, and none starts after: once it returns the lease
// no longer moves. (Canceling the renewal instead would not stop it: pgx returns at once on a
// canceled context while the server still commits the UPDATE it was sent.) Renewal errors are
// logged: if Postgres stays unreachable past the lease, a duplicate delivery may start a second
// call (at least once).
func (e *Executor) keepLease(ctx context.Context, job *jobs.Job, lost context.CancelCauseFunc) *leaseKeeper {
	k := &leaseKeeper{e: e, ctx: ctx, job: job, lost: lost}
	if job.LeaseToken == nil {
		k.stopped = true
		return k
	}
	// A timer, not a goroutine of its own: most calls end before the first renewal, and a
	// goroutine started and stopped per attempt cost two wake-ups each.
	k.mu.Lock()
	k.t = time.AfterFunc(e.cfg.LeaseRenewInterval, k.renew)
	k.mu.Unlock()
	return k
}

// leaseKeeper is keepLease's renewals of one attempt's lease, in one allocation (its state as
// variables of their own, the renewal's and stop's closures were 5, TestKeepLease_Allocs).
type leaseKeeper struct {
	e    *Executor
	ctx  context.Context // the delivery's: renewals outlive its cancellation (see renew)
	job  *jobs.Job
	lost context.CancelCauseFunc

	mu       sync.Mutex
	stopped  bool
	renewing sync.WaitGroup
	t        *time.Timer
}

// renew renews the lease once, on the timer's goroutine, and sets the timer for the next.
func (k *leaseKeeper) renew() {
	k.mu.Lock()
	if k.stopped {
		k.mu.Unlock()
		return
	}
	k.renewing.Add(1)
	k.mu.Unlock()
	defer k.renewing.Done()
	// The renewals outlive the caller's cancellation: stop, not the context, ends them. A
	// renewal that takes as long as the lease is moot: the lease has ended either way. The bound
	// keeps a Postgres that never answers from holding stop forever.
	ctx := context.WithoutCancel(k.ctx)
	rctx, cancel := context.WithTimeout(ctx, jobs.AttemptLease)
	ok, err := k.e.cfg.Store.RenewLease(rctx, k.job.ID, *k.job.LeaseToken)
	cancel()
	if err != nil {
		k.e.cfg.Logger.WarnContext(ctx, "renew attempt lease", "job_id", k.job.ID, "error", err)
	} else if !ok {
		// The job moved on without us: nothing left to hold, and the call is for nobody.
		if k.lost != nil {
			k.lost(errLeaseLost)
		}
		return
	}
	k.mu.Lock()
	if !k.stopped {
		k.t.Reset(k.e.cfg.LeaseRenewInterval)
	}
	k.mu.Unlock()
}

// stop ends the renewals: it returns once none is under way, and none starts after.
func (k *leaseKeeper) stop() {
	k.mu.Lock()
	k.stopped = true
	if k.t != nil {
		k.t.Stop()
	}
	k.mu.Unlock()
	k.renewing.Wait()
}

// pause stops the credential after a spend-cap answer so that no further request burns on it
// (in Postgres too, with Config.Pauses), and alerts once per pause episode across all processes
// (credpause.PauseSpendCap). Its writes outlive the delivery's cancellation, bounded as its other
// statements are.
func (e *Executor) pause(ctx context.Context, up Upstream, job *jobs.Job, reason, message string) error {
	wctx, cancel := e.storeCtx(context.WithoutCancel(ctx))
	defer cancel()
	return credpause.PauseSpendCap(wctx, credpause.SpendCapParams{Alerter: e.cfg.Alerter,
		Credential: up.Name, Gate: up.Gate, JobID: job.ID, Logger: e.cfg.Logger, Message: message,
		Reason: reason, Store: e.cfg.Pauses})
}

// restorePause writes the credential's pause state kept in Postgres (Config.Pauses) into Redis,
// which holds none (it lost it), and returns that state.
func (e *Executor) restorePause(ctx context.Context, up Upstream) (limiter.PauseState, error) {
	rctx, cancel := e.storeCtx(ctx)
	ps, restored, err := e.cfg.Pauses.Restore(rctx, up.Gate)
	cancel()
	if err != nil {
		return ps, err
	}
	if restored && ps.Paused {
		e.cfg.Logger.WarnContext(ctx, "credential pause restored from postgres: redis had lost it", "credential", up.Name,
			"since", ps.Since, "reason", ps.Reason)
	}
	return ps, nil
}

// timed records the time since t0 as the delivery's stage.
func (e *Executor) timed(stage string, t0 time.Time) {
	e.cfg.Metrics.stage(stage, e.cfg.Now().Sub(t0))
}
