package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/tokens"
)

// Credential is what the handler needs to call a provider with one configured key.
type Credential struct {
	// Name is the credential's configured name (a metric label; never the key).
	Name string
	// Kind is the provider kind ("anthropic", "openai"): how token counts are read.
	Kind string
	// Provider sends requests with this credential's key.
	Provider llm.Provider
	// AttemptTimeout bounds one provider call. Default 5m.
	AttemptTimeout time.Duration
	// FirstByteTimeout, when positive, bounds the wait for the first body byte of an answer
	// (generation that has not started); a job may override it. Zero: no such limit.
	FirstByteTimeout time.Duration
	// Breaker is the credential's circuit breaker, shared by all processes. Nil: none.
	Breaker *breaker.Credential
	// Limiter is the credential's shared admission (rate, retry budget, pause). Nil admits
	// everything at once (tests of the pipeline without a limiter).
	Limiter *limiter.Credential
	// Limit is the configured limit; zero means learn it from the provider.
	Limit limiter.Limit
	// PauseProbeInterval, when positive, lets one job per interval probe a paused credential;
	// its success resumes the credential. Zero: only an operator resumes it.
	PauseProbeInterval time.Duration
}

// HandlerConfig configures a Handler.
type HandlerConfig struct {
	Store       *Store
	Credentials map[string]Credential
	// Policy computes retry delays. Default retrypolicy.New(nil).
	Policy *retrypolicy.Policy
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives job outcomes (IDs and classes, never prompts or keys). Default discards.
	Logger *slog.Logger
	// Metrics, when set, is updated per attempt and outcome.
	Metrics *Metrics
	// MaxInlineWait is the longest wait a delivery sleeps before sending; longer waits go back to
	// asynq so that they do not hold a worker slot. Default 3s. asynq stores scheduled times in
	// whole seconds and releases tasks up to 1s early, so this must stay above 1s.
	MaxInlineWait time.Duration
	// Alerter raises dead-letter alerts. Nil: none (the metric and the job row remain).
	Alerter *Alerter
	// Estimator estimates a request's tokens for the token buckets and learns from the
	// provider's counts. Nil: requests are reserved without tokens.
	Estimator *estimator.Estimator
	// Float64 returns a random number in [0,1) to spread re-checks of paused credentials and
	// spent budgets. Default math/rand/v2.
	Float64 func() float64
}

// Re-check intervals for jobs that may not be sent yet; each gets up to the same again as
// random spread so that waiting jobs do not return together.
const (
	pausedRecheck = 5 * time.Second
	budgetRecheck = time.Second
)

// Handler executes one attempt of a job per asynq delivery. Deliveries are at-least-once; the
// handler makes that safe: a terminal job is skipped, and a result is stored only by a
// conditional transition from a non-terminal status.
type Handler struct {
	cfg HandlerConfig
}

// NewHandler returns a Handler. It panics when Store is nil (a wiring bug).
func NewHandler(cfg HandlerConfig) *Handler {
	if cfg.Store == nil {
		panic("jobs.NewHandler: Store is required")
	}
	if cfg.Policy == nil {
		cfg.Policy = retrypolicy.New(nil)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxInlineWait == 0 {
		cfg.MaxInlineWait = 3 * time.Second
	}
	if cfg.Float64 == nil {
		cfg.Float64 = rand.Float64
	}
	for name, c := range cfg.Credentials {
		if c.AttemptTimeout == 0 {
			c.AttemptTimeout = 5 * time.Minute
			cfg.Credentials[name] = c
		}
	}
	return &Handler{cfg: cfg}
}

// DeferError asks asynq to deliver the task again at Until without counting a failure.
type DeferError struct {
	Until  time.Time
	Reason string
	// unavailable: the credential cannot take requests now (breaker open, paused), so a job
	// with a fallback moves on instead of waiting.
	unavailable bool
	// stored: Until is already in the job row (a retry delay, a held limiter slot).
	stored bool
}

func (e *DeferError) Error() string {
	return fmt.Sprintf("deferred until %s: %s", e.Until.Format(time.RFC3339Nano), e.Reason)
}

// IsFailure tells asynq which errors count as failures: deferrals do not.
func IsFailure(err error) bool {
	var d *DeferError
	return !errors.As(err, &d)
}

// RetryDelayFunc returns asynq's RetryDelayFunc: deferrals come back at their time (asynq keeps
// whole seconds, so up to a second early, and the handler waits out the rest); a task whose
// worker died (asynq.ErrLeaseExpired) comes back at once (the attempt lease in Postgres keeps a
// live call from being doubled); any other error (Postgres unreachable, say) backs off with full
// jitter over at most maxStoreRetryStep doublings of the policy's base delay. asynq's n counts
// every deferral too, so it says nothing about how long the stores have been failing: without
// the cap, a job deferred a few times waited minutes after a worker crash or a Postgres blip.
func RetryDelayFunc(policy *retrypolicy.Policy, now func() time.Time) asynq.RetryDelayFunc {
	return func(n int, err error, _ *asynq.Task) time.Duration {
		var d *DeferError
		switch {
		case errors.As(err, &d):
			return max(0, d.Until.Sub(now()))
		case errors.Is(err, asynq.ErrLeaseExpired):
			return 0
		}
		return policy.Delay(min(n+1, maxStoreRetryStep), retrypolicy.Decision{Class: retrypolicy.ClassNetwork, Retry: true})
	}
}

// maxStoreRetryStep caps the backoff step of a delivery that failed on the stores.
const maxStoreRetryStep = 3

// ProcessTask implements asynq.Handler.
func (h *Handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p taskPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return fmt.Errorf("decode task payload: %v: %w", err, asynq.SkipRetry)
	}
	err := h.Process(ctx, p.JobID)
	var d *DeferError
	if errors.As(err, &d) && !d.stored {
		// asynq keeps whole seconds and may hand the task back up to a second early; with
		// the time in the row, that delivery sleeps the rest instead of being deferred again
		// (which, for every waiting job, would spin while a breaker is open).
		if perr := h.cfg.Store.Postpone(context.WithoutCancel(ctx), p.JobID, d.Until); perr != nil {
			return perr
		}
	}
	return err
}

// Process runs one attempt of job id (or defers it). It returns nil when the job needs nothing
// more from this delivery, a *DeferError when it must come back later, and another error when the
// stores failed (asynq retries the delivery).
func (h *Handler) Process(ctx context.Context, id string) error {
	start := h.cfg.Now()
	job, err := h.cfg.Store.Get(ctx, id)
	h.timed(StageLoad, start)
	if err == nil && firstDelivery(ctx, job) {
		h.cfg.Metrics.stage(StagePickup, start.Sub(job.CreatedAt))
	}
	if errors.Is(err, ErrNotFound) {
		h.cfg.Logger.WarnContext(ctx, "task for a job that does not exist; dropping it", "job_id", id)
		return nil
	}
	if err != nil {
		return err
	}
	if job.Status.Terminal() {
		return nil
	}
	now := h.cfg.Now()
	if job.Leased(now) {
		// Another delivery's call is in flight (this one is a duplicate: a re-enqueue after
		// Redis lost the task, say). Look again soon: by then it may have finished the job or
		// handed it back (and, if this is the only task left, nothing else would run it).
		return leasedDefer(now, *job.LeaseUntil)
	}
	if !now.Before(job.Deadline) {
		return h.finish(ctx, job, nil, Outcome{Status: StatusFailed, LastError: &LastError{
			Class: ReasonDeadlineExceeded, Message: "job deadline passed before it could succeed",
		}})
	}
	cred, ok := h.cfg.Credentials[job.CurrentCredential()]
	if !ok {
		// Configuration changed under a queued job: nothing can ever send it.
		return h.finish(ctx, job, nil, Outcome{Status: StatusFailed, LastError: &LastError{
			Class: string(retrypolicy.ClassPermanent), Message: fmt.Sprintf("credential %q is no longer configured", job.CurrentCredential()),
		}})
	}
	if job.NextAttemptAt != nil {
		if err := h.waitUntil(ctx, *job.NextAttemptAt, "retry delay"); err != nil {
			return err
		}
	}
	// The breaker first: while the provider is down, jobs wait without taking a rate slot or
	// counting an attempt, and after the cooldown exactly one probe goes out cluster-wide.
	var brk *breaker.Admission
	if cred.Breaker != nil {
		t0 := h.cfg.Now()
		a, err := h.allowBreaker(ctx, job, cred)
		h.timed(StageBreaker, t0)
		if err != nil {
			return err
		}
		if !a.Allowed {
			reason := "circuit " + string(a.State)
			if a.Capped {
				// A cold credential waiting for its first answer is not known to be down: wait
				// on it rather than fail over.
				reason = "circuit cold start: waiting for a first answer"
			}
			return h.failOver(ctx, job, &DeferError{Until: h.cfg.Now().Add(a.Wait), Reason: reason, unavailable: !a.Capped})
		}
		brk = &a
	}
	adm := admission{breaker: brk}
	if job.SlotSeq != nil {
		// The slot (and its tokens) was taken by an earlier delivery and is due now.
		adm.seq = *job.SlotSeq
		if job.SlotGrant != nil {
			adm.grant = *job.SlotGrant
		}
	} else if cred.Limiter != nil {
		t0 := h.cfg.Now()
		a, err := h.admit(ctx, job, cred)
		h.timed(StageAdmit, t0)
		if errors.Is(err, tokens.ErrTooLarge) {
			h.reportBreaker(ctx, cred, brk, breaker.Neutral)
			return h.finish(ctx, job, nil, Outcome{Status: StatusFailed, LastError: &LastError{
				Class: string(retrypolicy.ClassPermanent), Message: "request can never be sent: " + err.Error(),
			}})
		}
		if err != nil {
			h.reportBreaker(ctx, cred, brk, breaker.Neutral) // not sent: hand a probe on
			return h.failOver(ctx, job, err)
		}
		adm.seq, adm.grant, adm.est, adm.pauseProbe = a.seq, a.grant, a.est, a.pauseProbe
	}
	request := job.Request
	t0 := h.cfg.Now()
	job, err = h.cfg.Store.BeginAttempt(ctx, id)
	h.timed(StageBegin, t0)
	if err != nil {
		h.reportBreaker(ctx, cred, brk, breaker.Neutral)
		var leased *LeasedError
		if errors.As(err, &leased) {
			return leasedDefer(h.cfg.Now(), leased.Until)
		}
		if errors.Is(err, ErrNotRunnable) {
			return nil
		}
		return err
	}
	job.Request = request // BeginAttempt leaves the (unchanging) body where Get read it
	return h.attempt(ctx, job, cred, adm)
}

// firstDelivery reports whether this delivery is the job's first: nothing attempted, deferred
// or failed over yet, and not asynq's retry of a delivery that failed on the stores.
func firstDelivery(ctx context.Context, job *Job) bool {
	if n, ok := asynq.GetRetryCount(ctx); ok && n > 0 {
		return false
	}
	return job.Status == StatusQueued && job.Attempts == 0 && job.NextAttemptAt == nil && job.CredentialIndex == 0
}

// leaseRecheck is how soon a delivery that found the job leased by another looks again. Not the
// lease's end: the holder usually finishes or hands the job back well before it, and when the
// holder's own task was lost (a Redis flush), this delivery's task is the only one left.
const leaseRecheck = 2 * time.Second

// leasedDefer defers a delivery that found the job's attempt leased until leaseUntil, or for
// leaseRecheck if that is sooner.
func leasedDefer(now, leaseUntil time.Time) *DeferError {
	return &DeferError{Until: minTime(leaseUntil, now.Add(leaseRecheck)), Reason: "another delivery's attempt holds the job"}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// allowBreaker asks the credential's breaker. A refused job due back within MaxInlineWait (the
// cooldown ends soon, a probe or the cold-start cap's requests are out) waits here instead of
// going back to the queue, and asks again as soon as a probe or cold-start request reports (see
// breaker.Listen) or its wait ends: the probe goes at the cooldown's end, and when it closes the
// breaker the waiting jobs go at once, not a re-check later. A job with a fallback left is not
// held on an open or half-open breaker: failOver moves it on at once.
func (h *Handler) allowBreaker(ctx context.Context, job *Job, cred Credential) (breaker.Admission, error) {
	deadline := h.cfg.Now().Add(h.cfg.MaxInlineWait)
	for {
		wake := cred.Breaker.Wakeup()
		a, err := cred.Breaker.Allow(ctx)
		if err != nil || a.Allowed || (!a.Capped && job.HasNextCredential()) {
			return a, err
		}
		if h.cfg.Now().Add(a.Wait).After(deadline) {
			return a, nil
		}
		if err := breaker.Await(ctx, wake, a.Wait); err != nil {
			return breaker.Admission{}, err
		}
	}
}

// failOver moves a job whose credential cannot take requests now (breaker open, paused) to its
// next fallback at once, instead of waiting for the credential to heal: sequential waiting is
// what makes failover slow. Other errors, and jobs without a fallback left, pass through.
func (h *Handler) failOver(ctx context.Context, job *Job, err error) error {
	var d *DeferError
	if !errors.As(err, &d) || !d.unavailable || !job.HasNextCredential() {
		return err
	}
	moved, merr := h.cfg.Store.NextCredential(ctx, job.ID)
	if merr != nil {
		return merr
	}
	if !moved {
		return err
	}
	h.cfg.Logger.InfoContext(ctx, "failing over", "job_id", job.ID, "from", job.CurrentCredential(), "reason", d.Reason)
	return h.Process(ctx, job.ID)
}

// reportBreaker tells the breaker how an admitted call went. Errors are logged: the breaker's
// bookkeeping must not decide the job's outcome.
func (h *Handler) reportBreaker(ctx context.Context, cred Credential, a *breaker.Admission, o breaker.Outcome) {
	if a == nil {
		return
	}
	if _, err := cred.Breaker.Report(context.WithoutCancel(ctx), *a, o); err != nil {
		h.cfg.Logger.WarnContext(ctx, "breaker report", "credential", cred.Name, "error", err)
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

// admission is what the breaker and the limiter granted for one attempt.
type admission struct {
	breaker    *breaker.Admission  // nil: no breaker
	seq        int64               // the limiter slot, for Observe
	grant      int64               // the token reservation, for Reconcile (0: none)
	est        *estimator.Estimate // the estimate the grant was reserved with (nil: make it again)
	pauseProbe bool                // an automatic probe of a paused credential
}

// admit asks the credential's shared limiter whether and when this attempt may be sent: not
// while the credential is paused (unless this is the interval's probe), not past the retry
// budget, and at the send time of a rate-limiter slot. It sleeps short waits and returns a
// *DeferError for long ones, holding the slot in the job row.
//
// A first attempt costs one Redis round trip: the pause check and the count of first attempts
// (the retry budget's base) go in the reservation's script. A retry that draws on the budget
// checks the pause on its own first, so that a paused credential draws nothing.
func (h *Handler) admit(ctx context.Context, job *Job, cred Credential) (admission, error) {
	lc := cred.Limiter
	var adm admission
	opts := limiter.AttemptOptions{UnlessPaused: true, FirstAttempt: job.Attempts == 0}
	if job.Attempts > 0 && drawsOnRetryBudget(job) {
		ps, err := lc.Paused(ctx)
		if err != nil {
			return adm, err
		}
		if ps.Paused {
			if adm.pauseProbe, err = h.pauseProbe(ctx, cred, ps); err != nil {
				return adm, err
			}
		}
		opts.UnlessPaused = false
		if !adm.pauseProbe {
			if err := h.drawRetry(ctx, job, lc); err != nil {
				return adm, err
			}
		}
	}
	cost, est := h.cost(cred, job)
	adm.est = est
	res, err := lc.AcquireAttempt(ctx, cred.Limit, cost, h.cfg.MaxInlineWait, opts)
	if err == nil && res.Paused.Paused {
		if adm.pauseProbe, err = h.pauseProbe(ctx, cred, res.Paused); err != nil {
			return adm, err
		}
		opts.UnlessPaused = false
		res, err = lc.AcquireAttempt(ctx, cred.Limit, cost, h.cfg.MaxInlineWait, opts)
	}
	if err != nil {
		return adm, err
	}
	until := h.cfg.Now().Add(res.Wait)
	if !res.Granted {
		return adm, &DeferError{Until: until, Reason: "waiting for the rate limit to be learned"}
	}
	adm.seq, adm.grant = res.Seq, res.Grant
	if res.Wait > h.cfg.MaxInlineWait {
		if err := h.cfg.Store.HoldSlot(ctx, job.ID, until, res.Seq, res.Grant); err != nil {
			return adm, err
		}
		return adm, &DeferError{Until: until, Reason: "rate limit slot", stored: true}
	}
	return adm, sleep(ctx, res.Wait)
}

// pauseProbe answers an attempt on paused credential cred: true when it is the automatic probe
// of the pause (one per PauseProbeInterval, cluster-wide), else a *DeferError to look again.
func (h *Handler) pauseProbe(ctx context.Context, cred Credential, ps limiter.PauseState) (bool, error) {
	if cred.PauseProbeInterval > 0 {
		probe, err := cred.Limiter.TryProbe(ctx, cred.PauseProbeInterval)
		if err != nil || probe {
			return probe, err
		}
	}
	recheck := pausedRecheck
	if cred.PauseProbeInterval > 0 {
		recheck = min(recheck, cred.PauseProbeInterval)
	}
	return false, &DeferError{Until: h.cfg.Now().Add(h.spread(recheck)), Reason: "credential paused: " + ps.Reason, unavailable: true}
}

// drawRetry asks the shared retry budget for the job's retry, or returns a *DeferError when it
// is spent. Timeouts are the normal failure of long generations: they draw on their own budget.
func (h *Handler) drawRetry(ctx context.Context, job *Job, lc *limiter.Credential) error {
	allow, budget := lc.AllowRetry, "retry budget spent"
	if job.LastError != nil && job.LastError.Class == string(retrypolicy.ClassTimeout) {
		allow, budget = lc.AllowTimeoutRetry, "timeout retry budget spent"
	}
	ok, err := allow(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return &DeferError{Until: h.cfg.Now().Add(h.spread(budgetRecheck)), Reason: budget}
	}
	return nil
}

// drawsOnRetryBudget reports whether the job's next attempt is a retry the shared retry budget
// must allow. Two kinds are not: a retry after a 429 with Retry-After (the limiter paces it: the
// answer pushed the credential's whole schedule back), and a re-attempt of a call whose outcome
// was never recorded (the job is still running, its lease ended: the worker died, the provider
// did not fail). Charging those let a Redis flush or a worker crash hold recovered jobs back for
// minutes behind a budget meant to stop retry storms against a failing provider.
func drawsOnRetryBudget(job *Job) bool {
	if job.Status == StatusRunning {
		return false
	}
	return job.LastError == nil || job.LastError.Class != string(retrypolicy.ClassRateLimited)
}

// cost is the job's estimated tokens for the token buckets, and the estimate behind it (zero and
// nil without an estimator, or for a body the estimator cannot read: the provider judges that one).
func (h *Handler) cost(cred Credential, job *Job) (tokens.Cost, *estimator.Estimate) {
	if h.cfg.Estimator == nil {
		return tokens.Cost{}, nil
	}
	est, err := h.cfg.Estimator.Estimate(cred.Name, cred.Kind, job.Request)
	if err != nil {
		return tokens.Cost{}, nil
	}
	return tokens.Cost{InputTokens: est.Input, OutputTokens: est.MaxOutput, MinInputTokens: est.Raw}, &est
}

// spread returns d plus U(0, d).
func (h *Handler) spread(d time.Duration) time.Duration {
	return d + time.Duration(h.cfg.Float64()*float64(d))
}

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

// waitUntil sleeps until t when that is within MaxInlineWait, else defers the delivery.
func (h *Handler) waitUntil(ctx context.Context, t time.Time, reason string) error {
	wait := t.Sub(h.cfg.Now())
	if wait <= 0 {
		return nil
	}
	if wait > h.cfg.MaxInlineWait {
		return &DeferError{Until: t, Reason: reason, stored: true} // t came from the row
	}
	return sleep(ctx, wait)
}

func (h *Handler) attempt(ctx context.Context, job *Job, cred Credential, adm admission) error {
	started := h.cfg.Now()
	attemptTimeout, firstByte := cred.AttemptTimeout, cred.FirstByteTimeout
	if job.AttemptTimeout != nil {
		attemptTimeout = time.Duration(*job.AttemptTimeout)
	}
	if job.FirstByteTimeout != nil {
		firstByte = time.Duration(*job.FirstByteTimeout)
	}
	callCtx, cancel := context.WithTimeout(ctx, min(attemptTimeout, job.Deadline.Sub(started)))
	// The lease is kept until the outcome is recorded, not only through the call: recording may
	// wait for Postgres (see record), and the job must not be taken over meanwhile.
	stopRenewing := h.keepLease(ctx, job)
	defer stopRenewing()
	resp, callErr := cred.Provider.Send(callCtx, job.Request, llm.SendOptions{FirstByteTimeout: firstByte})
	cancel()
	now := h.cfg.Now()
	h.cfg.Metrics.stage(StageCall, now.Sub(started))
	a := &Attempt{Number: job.Attempts, Credential: cred.Name, StartedAt: started, Latency: now.Sub(started)}
	if job.LeaseToken != nil {
		a.LeaseToken = *job.LeaseToken
	}
	d := retrypolicy.Classify(callErr, now)
	h.afterCall(ctx, cred, adm, job, resp, callErr, d, started, now)
	h.timed(StageBookkeeping, now)

	if callErr == nil {
		a.StatusCode, a.TTFB, a.Class = resp.StatusCode, resp.TimeToFirstByte, string(retrypolicy.ClassOK)
		usage, _ := json.Marshal(resp.Usage)
		h.cfg.Metrics.attempt(cred.Name, a.Class, a.Latency)
		return h.finish(ctx, job, a, Outcome{Status: StatusSucceeded, Result: resp.Body, Usage: usage, AnsweredBy: cred.Name})
	}

	a.Class, a.StatusCode, a.Error = string(d.Class), d.StatusCode, callErr.Error()
	var se *llm.StatusError
	if errors.As(callErr, &se) {
		a.TTFB = se.TimeToFirstByte
	}
	if d.HasRetryAfter {
		ra := d.RetryAfter
		a.RetryAfter = &ra
	}
	h.cfg.Metrics.attempt(cred.Name, a.Class, a.Latency)
	lastErr := lastErrorOf(callErr, d)

	switch {
	case d.Class == retrypolicy.ClassCanceled:
		// Our own context ended (shutdown): give the job back untouched for the next delivery.
		if ctx.Err() != nil {
			if _, err := h.record(context.WithoutCancel(ctx), job.ID, a, Outcome{Status: StatusRetrying, LastError: lastErr}); err != nil {
				return err
			}
			return ctx.Err()
		}
		return h.finish(ctx, job, a, Outcome{Status: StatusFailed, LastError: lastErr})
	case (d.Retry || d.DeadReason != "") && job.HasNextCredential() && job.Attempts < job.MaxAttempts:
		// Fail over at once: the fallback is a different key, so neither a backoff for this
		// provider's trouble nor its spend cap applies to it.
		if d.DeadReason != "" {
			if err := h.pause(ctx, cred, job, d.DeadReason, lastErr.Message); err != nil {
				return err
			}
		}
		if _, err := h.record(context.WithoutCancel(ctx), job.ID, a, Outcome{Status: StatusRetrying, LastError: lastErr, NextCredential: true}); err != nil {
			return err
		}
		return &DeferError{Until: now, Reason: "fail over after " + string(d.Class), stored: true}
	case d.DeadReason != "":
		if err := h.finish(ctx, job, a, Outcome{Status: StatusDead, DeadReason: d.DeadReason, LastError: lastErr}); err != nil {
			return err
		}
		return h.pause(ctx, cred, job, d.DeadReason, lastErr.Message)
	case !d.Retry:
		return h.finish(ctx, job, a, Outcome{Status: StatusFailed, LastError: lastErr})
	case job.Attempts >= job.MaxAttempts:
		if err := h.finish(ctx, job, a, Outcome{Status: StatusDead, DeadReason: ReasonRetriesExhausted, LastError: lastErr}); err != nil {
			return err
		}
		h.cfg.Alerter.Throttled(ctx, Alert{Credential: cred.Name, Reason: ReasonRetriesExhausted, JobID: job.ID,
			Message: fmt.Sprintf("job used all %d attempts; last error: %s", job.MaxAttempts, lastErr.Message)}, time.Minute)
		return nil
	}
	delay := h.cfg.Policy.Delay(job.Attempts, d)
	next := now.Add(delay)
	if !next.Before(job.Deadline) {
		lastErr.Message = fmt.Sprintf("deadline passes before the next attempt could start (%s)", lastErr.Message)
		lastErr.Class = ReasonDeadlineExceeded
		return h.finish(ctx, job, a, Outcome{Status: StatusFailed, LastError: lastErr})
	}
	a.Delay = &delay
	if _, err := h.record(context.WithoutCancel(ctx), job.ID, a, Outcome{Status: StatusRetrying, LastError: lastErr, NextAttemptAt: &next}); err != nil {
		return err
	}
	return &DeferError{Until: next, Reason: "retry after " + string(d.Class), stored: true}
}

// keepLease renews the attempt's lease (Store.RenewLease) every third of AttemptLease until the
// returned stop is called, so that a long call keeps other deliveries of the job waiting while
// a dead one frees the job within AttemptLease. Renewal errors are logged: if Postgres stays
// unreachable past the lease, a duplicate delivery may start a second call (at least once).
func (h *Handler) keepLease(ctx context.Context, job *Job) (stop func()) {
	if job.LeaseToken == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(AttemptLease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if ok, err := h.cfg.Store.RenewLease(ctx, job.ID, *job.LeaseToken); err != nil && ctx.Err() == nil {
					h.cfg.Logger.WarnContext(ctx, "renew attempt lease", "job_id", job.ID, "error", err)
				} else if err == nil && !ok {
					return // the job moved on without us (canceled); nothing left to hold
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// afterCall does the bookkeeping of an attempt that was sent, in one Redis round trip: it tells
// the limiter what the attempt showed (the learned limit, a Retry-After push-back, the tokens the
// provider counted) and the breaker how it went; then it resumes a paused credential whose probe
// got through. (First attempts were counted for the retry budget when their slot was granted,
// see admit.) Errors are logged: the attempt's outcome matters more than bookkeeping.
func (h *Handler) afterCall(ctx context.Context, cred Credential, adm admission, job *Job, resp *llm.Response,
	callErr error, d retrypolicy.Decision, sent, now time.Time) {
	ctx = context.WithoutCancel(ctx)
	lc := cred.Limiter
	if lc == nil {
		h.reportBreaker(ctx, cred, adm.breaker, breakerOutcome(d))
		return
	}
	o := observation(cred, adm, resp, callErr, d, sent, now)
	calls := lc.ObserveCalls(o)
	if call, ok := h.reconcileCall(ctx, cred, adm, job, resp, o.StatusCode); ok {
		calls = append(calls, call)
	}
	if adm.breaker != nil {
		call, err := cred.Breaker.ReportCall(*adm.breaker, breakerOutcome(d), nil)
		if err != nil {
			h.cfg.Logger.WarnContext(ctx, "breaker report", "credential", cred.Name, "error", err)
		} else {
			calls = append(calls, call)
		}
	}
	// The breaker's keys live on the limiter's Redis (the worker gives both one server).
	if err := redisscript.Run(ctx, lc.Redis(), calls...); err != nil {
		h.cfg.Logger.WarnContext(ctx, "after-call bookkeeping (limiter, breaker)", "credential", cred.Name, "error", err)
	}
	if adm.pauseProbe && callErr == nil {
		if _, err := lc.Resume(ctx); err != nil {
			h.cfg.Logger.WarnContext(ctx, "resume after probe", "credential", cred.Name, "error", err)
		} else {
			h.cfg.Logger.WarnContext(ctx, "credential resumed: the pause probe succeeded", "credential", cred.Name, "job_id", job.ID)
		}
	}
}

// observation is what the attempt's answer (or failure) tells the limiter.
func observation(cred Credential, adm admission, resp *llm.Response, callErr error, d retrypolicy.Decision, sent, now time.Time) limiter.Observation {
	o := limiter.Observation{At: now, SentAt: sent, Seq: adm.seq, Grant: adm.grant}
	var rl llm.RateLimit
	var se *llm.StatusError
	switch {
	case resp != nil:
		o.StatusCode, rl = resp.StatusCode, resp.RateLimit
	case errors.As(callErr, &se):
		o.StatusCode, rl = se.StatusCode, se.RateLimit
	}
	if rl.Known {
		o.HeadersKnown, o.Limit, o.Remaining, o.ResetAt = true, rl.Limit, rl.Remaining, rl.ResetAt
		o.ResetAbsolute, o.ResetGranularity = rl.ResetAbsolute, rl.ResetGranularity
	}
	o.InputTokens, o.OutputTokens = tokenObservation(rl.Tokens.Input), tokenObservation(rl.Tokens.Output)
	if cred.Kind == string(llm.KindOpenAI) {
		// Anthropic's tokens-* family reports its most restrictive limit, not a bucket.
		o.Tokens = tokenObservation(rl.Tokens.Combined)
	}
	if o.StatusCode == 429 && d.HasRetryAfter {
		o.RetryAfter, o.HasRetryAfter = d.RetryAfter, true
	}
	return o
}

// reconcileCall is the call that trues the token buckets up to what the provider counted: the
// reported usage after an answer, nothing for a 429 (the provider charged nothing), the input
// alone for another error. With no answer at all the reservation stays charged (the provider may
// have counted it): ok is false then, and when no tokens were reserved.
func (h *Handler) reconcileCall(ctx context.Context, cred Credential, adm admission, job *Job, resp *llm.Response, status int) (redisscript.Call, bool) {
	if adm.grant == 0 || status == 0 {
		return redisscript.Call{}, false
	}
	est := adm.est
	if est == nil { // the slot was held by an earlier delivery: estimate again
		_, est = h.cost(cred, job)
	}
	var actual tokens.Cost
	switch {
	case resp != nil:
		actual = tokens.Cost{InputTokens: resp.Usage.InputTokens, OutputTokens: resp.Usage.OutputTokens}
		if est != nil {
			h.cfg.Estimator.Observe(cred.Name, *est, resp.Usage.InputTokens)
		}
	case status == 429:
	case est != nil:
		actual = tokens.Cost{InputTokens: est.Input}
	}
	call, ok, err := cred.Limiter.ReconcileCall(adm.grant, actual)
	if err != nil {
		h.cfg.Logger.WarnContext(ctx, "token reconcile", "credential", cred.Name, "error", err)
	}
	return call, ok
}

func tokenObservation(t llm.TokenLimit) limiter.TokenObservation {
	if !t.Known {
		return limiter.TokenObservation{}
	}
	return limiter.TokenObservation{Known: true, Limit: t.Limit, Remaining: t.Remaining,
		RemainingGranularity: t.RemainingGranularity, ResetAt: t.ResetAt,
		ResetGranularity: t.ResetGranularity, ResetAbsolute: t.ResetAbsolute}
}

// pause stops the credential after a spend-cap answer so that no further request burns on it,
// and alerts once per pause episode across all processes.
func (h *Handler) pause(ctx context.Context, cred Credential, job *Job, reason, message string) error {
	if cred.Limiter == nil {
		h.cfg.Alerter.Throttled(ctx, Alert{Credential: cred.Name, Reason: reason, JobID: job.ID, Message: message}, time.Minute)
		return nil
	}
	started, err := cred.Limiter.Pause(context.WithoutCancel(ctx), reason, job.ID)
	if err != nil {
		return err
	}
	if started {
		h.cfg.Alerter.Raise(ctx, Alert{Credential: cred.Name, Reason: reason, JobID: job.ID,
			Message: "credential paused until an operator resumes it (ctl credentials resume " + cred.Name + "): " + message})
	}
	return nil
}

// finish moves the job to a terminal outcome. Writes survive the delivery's cancellation.
func (h *Handler) finish(ctx context.Context, job *Job, a *Attempt, o Outcome) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	applied, err := h.record(wctx, job.ID, a, o)
	if err != nil {
		return err
	}
	if !applied {
		return nil
	}
	h.cfg.Metrics.outcome(job.Credential, o.Status, o.DeadReason, h.cfg.Now().Sub(job.CreatedAt))
	attrs := []any{"job_id", job.ID, "credential", job.Credential, "status", o.Status, "attempts", job.Attempts}
	switch o.Status {
	case StatusDead:
		h.cfg.Logger.ErrorContext(ctx, "job dead-lettered", append(attrs, "reason", o.DeadReason, "class", o.LastError.Class)...)
	case StatusFailed:
		h.cfg.Logger.WarnContext(ctx, "job failed", append(attrs, "class", o.LastError.Class)...)
	default:
		h.cfg.Logger.DebugContext(ctx, "job finished", attrs...)
	}
	return nil
}

// recordRetryWindow is how long record keeps trying while Postgres cannot be reached.
const recordRetryWindow = 30 * time.Second

// record stores an attempt's outcome (Store.Finish), timed as StageRecord, retries included.
// While Postgres cannot be reached it tries again, backing off from 50 ms to 1 s, for up to
// recordRetryWindow (or until ctx ends), and returns the last error only then. The call has been
// made and paid for: handing the delivery back to asynq instead would leave the job's lease to
// run out and the call to be made again. Finish is safe to run again (a terminal outcome already
// stored answers applied=false).
func (h *Handler) record(ctx context.Context, id string, a *Attempt, o Outcome) (bool, error) {
	defer h.timed(StageRecord, h.cfg.Now())
	ctx, cancel := context.WithTimeout(ctx, recordRetryWindow)
	defer cancel()
	wait := 50 * time.Millisecond
	for tries := 1; ; tries++ {
		applied, err := h.cfg.Store.Finish(ctx, id, a, o)
		if err == nil || !IsUnavailable(err) || ctx.Err() != nil {
			if err == nil && tries > 1 {
				h.cfg.Logger.InfoContext(ctx, "attempt outcome recorded after postgres came back", "job_id", id, "tries", tries)
			}
			return applied, err
		}
		if tries == 1 {
			h.cfg.Logger.WarnContext(ctx, "postgres unavailable while recording an attempt's outcome; trying again",
				"job_id", id, "error", err)
		}
		if sleep(ctx, wait) != nil {
			return false, err
		}
		wait = min(2*wait, time.Second)
	}
}

// timed records the time since t0 as the delivery's stage.
func (h *Handler) timed(stage string, t0 time.Time) {
	h.cfg.Metrics.stage(stage, h.cfg.Now().Sub(t0))
}

func lastErrorOf(err error, d retrypolicy.Decision) *LastError {
	le := &LastError{Class: string(d.Class), Status: d.StatusCode, Message: err.Error()}
	var se *llm.StatusError
	if errors.As(err, &se) {
		le.Message = se.Message
		le.Type = se.ErrorType()
	}
	if d.HasRetryAfter {
		ms := d.RetryAfter.Milliseconds()
		le.RetryAfterMS = &ms
	}
	return le
}
