package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/logthrottle"
	"github.com/llmq/llmq/internal/retrypolicy"
	"github.com/llmq/llmq/internal/slotshare"
)

// Upstream is everything the executor needs to send a job through one configured credential:
// its provider adapter, its shared limiter gate and circuit, and its call timeouts.
type Upstream struct {
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
	// StallTimeout, when positive, bounds the wait for each next byte of an answer whose body
	// has begun (an answer that stalled partway); no job overrides it. Zero: no such limit.
	StallTimeout time.Duration
	// Circuit is the credential's circuit breaker, shared by all processes. Nil: none.
	Circuit *breaker.Circuit
	// Gate is the credential's shared admission (rate, retry budget, pause). Nil admits
	// everything at once (tests of the pipeline without a limiter).
	Gate *limiter.Gate
	// Limit is the configured limit; zero means learn it from the provider.
	Limit limiter.Limit
	// PauseProbeInterval, when positive, lets one job per interval probe a paused credential;
	// its success resumes the credential. Zero: only an operator resumes it.
	PauseProbeInterval time.Duration
}

// Config configures an Executor.
type Config struct {
	// Store is the job store. Required.
	Store *jobs.Store
	// Upstreams are the configured credentials by name.
	Upstreams map[string]Upstream
	// Policy computes retry delays. Default retrypolicy.New(nil).
	Policy *retrypolicy.Policy
	// Now is the clock. Default time.Now.
	Now func() time.Time
	// Logger receives job outcomes (IDs and classes, never prompts or keys). Default discards.
	Logger *slog.Logger
	// Metrics, when set, is updated per attempt and outcome.
	Metrics *Metrics
	// MaxInlineWait is the longest wait a delivery sleeps before sending; longer waits go back to
	// asynq so that they do not hold a worker slot. Default DefaultMaxInlineWait. asynq stores
	// scheduled times in whole seconds and releases tasks up to 1s early, so this must stay
	// above 1s.
	MaxInlineWait time.Duration
	// Alerter raises dead-letter alerts. Nil: none (the metric and the job row remain).
	Alerter *alert.Alerter
	// Pauses keeps credential pauses in Postgres, so that a pause survives Redis losing its data:
	// a spend cap records its pause there, a successful pause probe ends it, and an admission
	// that finds Redis holding no pause state restores it from there before anything is sent.
	// Nil: pauses live in Redis only.
	Pauses *credpause.Store
	// Estimator estimates a request's tokens for the token buckets and learns from the
	// provider's counts. Nil: requests are reserved without tokens.
	Estimator *estimator.Estimator
	// TenantWeight returns a tenant's weight (tenant.Store.Weight, cached). When set, every
	// attempt is queued fairly on its credential in its lane (tenant × priority; see
	// limiter.Lane); nil: attempts take the credential's slots in the order they ask.
	TenantWeight func(ctx context.Context, tenant string) (int, error)
	// CachedTenantWeight returns a tenant's weight without waiting (tenant.Weights.Cached),
	// false when it has none at hand: AdmitFirst, which runs inside a job's insert transaction,
	// must not read Postgres. With TenantWeight set and this nil, AdmitFirst admits nothing. A
	// delivery takes the weight from it first, when set, and calls TenantWeight (bounded by
	// StoreTimeout) only when it has none at hand: both must answer the same weight.
	CachedTenantWeight func(tenant string) (int, bool)
	// Float64 returns a random number in [0,1) to spread re-checks of paused credentials and
	// spent budgets. Default math/rand/v2.
	Float64 func() float64
	// Deltas receives the deltas of streaming jobs ("stream": true), for the API's event
	// streams. Nil: streaming jobs run and store their result, but stream nothing.
	Deltas *deltastream.Buffer
	// BacklogSteps is how many deliveries of low-priority jobs may run their steps before the
	// call at once in this process (loading the job, asking for its turn, deferring it); the
	// rest wait for a place, so that a backlog's pass leaves the process's Postgres
	// connections and CPU to other priorities' jobs. Waits for a slot and the call itself are
	// outside. Zero: no bound.
	BacklogSteps int
	// StoreTimeout bounds each of a delivery's statements that does not go through the store's
	// batcher (whose batches have their own bound): a deferral's write, a slot held in the row,
	// a fail-over, a tenant's weight, a pause kept in Postgres. Past it the statement is
	// abandoned (pgx cancels it and closes its connection) and the delivery fails on the store,
	// to be delivered again: on a connection left open and silent, the delivery waited as long as
	// its task's timeout (an hour), or for ever for the writes that outlive its cancellation.
	// Default DefaultStoreTimeout.
	StoreTimeout time.Duration
	// UnconfiguredLogInterval is how often the dead letters of one credential missing from the
	// config (credential_not_configured) are logged: one line per credential per interval, the
	// next one (or a report of its own, once the interval has passed) saying how many were held
	// back. A config that lost a credential dead-letters every job on it, which its alert already
	// reports once per credential (unconfiguredAlertInterval). Other dead letters are logged one
	// line each. Default DefaultUnconfiguredLogInterval.
	UnconfiguredLogInterval time.Duration
	// LeaseRenewInterval is how often a running attempt renews its lease (jobs.Store.RenewLease),
	// a renewal that finds the job moved on (canceled, or taken over) stopping the call. Default
	// DefaultLeaseRenewInterval; tests that must tell a cancel's abort from a renewal's set it
	// beyond their deadline.
	LeaseRenewInterval time.Duration
	// Slots is how many deliveries asynq runs at once in this process (worker.concurrency).
	// When set, a tenant's deliveries from asynq hold at most its share of them once they are
	// scarce (see internal/slotshare): while more than a small reserve is free, any tenant takes
	// one; at the reserve, a tenant alone holds all but the reserve, so that another tenant's
	// task behind its backlog is delivered at all, and beside other tenants with work about
	// Slots × its weight / their weights' sum. A delivery over its tenant's share is deferred
	// before the breaker and the limiter (no attempt counted, no send slot taken), to come back
	// after a delay that grows while the tenant stays over (rounded up to a whole second, as
	// asynq keeps it), and pauses in its slot once its deferral is written and its place in the
	// backlog gate given back. A serve process's own first deliveries (ProcessFresh) have slots
	// of their own, a job finding them all taken going to asynq: they are not counted, nor is a
	// failover's run on the fallback (in its delivery's slot). A job past its deadline takes no
	// slot: the guard fails it. Zero: no share; deliveries take the slots first come first
	// served.
	Slots int
	// SingleTenant reports whether the deployment has a single tenant (tenant.Weights.Single),
	// whose deliveries may then take every slot: the reserve costs nothing. Nil: several.
	SingleTenant func() bool
	// RecordRetryWindow is how long recording an attempt's outcome keeps trying while Postgres
	// cannot be reached or the job's row stays locked (see record). Default
	// DefaultRecordRetryWindow; tests that must tell a wait behind the outcome's tries from none
	// set it beyond their deadline.
	RecordRetryWindow time.Duration
}

// DefaultUnconfiguredLogInterval is Config.UnconfiguredLogInterval's default.
const DefaultUnconfiguredLogInterval = time.Minute

// DefaultStoreTimeout is Config.StoreTimeout's default: far above what one row's statement
// takes on a healthy Postgres, even behind a short lock.
const DefaultStoreTimeout = 30 * time.Second

// DefaultLeaseRenewInterval is Config.LeaseRenewInterval's default: a third of
// jobs.AttemptLease, so that two renewals may fail before the lease ends.
const DefaultLeaseRenewInterval = jobs.AttemptLease / 3

// DefaultMaxInlineWait is Config.MaxInlineWait's default.
const DefaultMaxInlineWait = 3 * time.Second

// Re-check intervals for jobs that may not be sent yet; each gets up to the same again as
// random spread so that waiting jobs do not return together.
const (
	pausedRecheck = 5 * time.Second
	budgetRecheck = time.Second
)

// Executor executes one attempt of a job per delivery. Deliveries are at-least-once; the executor
// makes that safe: a terminal job is skipped, and a result is stored only by a conditional
// transition from a non-terminal status. Safe for concurrent use.
type Executor struct {
	cfg     Config
	backlog *backlogGate
	// started is when New ran, on Config.Now: a job created after it whose credential the
	// config lacks was accepted by a process of a newer config (see newerConfigMayKnow).
	started time.Time
	// unconfiguredLog throttles the lines of credential_not_configured dead letters, by
	// credential (Config.UnconfiguredLogInterval).
	unconfiguredLog *logthrottle.Throttle
	// shares shares the process's delivery slots between tenants (Config.Slots); nil: none.
	shares *slotshare.Tracker
	// turnAwaySleep waits out a turned-away delivery's turnAwayPause (sleep; a test's seam).
	turnAwaySleep func(ctx context.Context, d time.Duration) error
}

// New returns an Executor. It panics when Store is nil (a wiring bug).
func New(cfg Config) *Executor {
	if cfg.Store == nil {
		panic("executor.New: Store is required")
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
		cfg.MaxInlineWait = DefaultMaxInlineWait
	}
	if cfg.Float64 == nil {
		cfg.Float64 = rand.Float64
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.UnconfiguredLogInterval <= 0 {
		cfg.UnconfiguredLogInterval = DefaultUnconfiguredLogInterval
	}
	if cfg.LeaseRenewInterval <= 0 {
		cfg.LeaseRenewInterval = DefaultLeaseRenewInterval
	}
	if cfg.RecordRetryWindow <= 0 {
		cfg.RecordRetryWindow = DefaultRecordRetryWindow
	}
	for name, u := range cfg.Upstreams {
		if u.AttemptTimeout == 0 {
			u.AttemptTimeout = 5 * time.Minute
			cfg.Upstreams[name] = u
		}
	}
	cfg.Metrics.initCredentials(slices.Sorted(maps.Keys(cfg.Upstreams)))
	e := &Executor{cfg: cfg, backlog: newBacklogGate(cfg.BacklogSteps),
		started: cfg.Now(), turnAwaySleep: sleep}
	if cfg.Slots > 0 {
		e.shares = slotshare.New(slotshare.Config{Slots: cfg.Slots, Now: cfg.Now, Float64: cfg.Float64})
	}
	e.unconfiguredLog = logthrottle.New(&logthrottle.Config{Every: cfg.UnconfiguredLogInterval,
		Now: cfg.Now, Report: e.unconfiguredSuppressed})
	return e
}

// Stop cancels the pending reports of dead-letter lines held back (UnconfiguredLogInterval),
// and schedules none after: what is held back from then on is counted in the next line only.
// Call it once the executor runs no more deliveries. It is idempotent and safe for concurrent
// use.
func (e *Executor) Stop() { e.unconfiguredLog.Stop() }

// errHandled ends a delivery that needs nothing more: the job is terminal, was recorded, or was
// handled by a nested delivery (a failover).
var errHandled = errors.New("delivery handled")

// deferral is a delivery that must come back at until (see dispatch.DeferError).
type deferral struct {
	until  time.Time
	reason string
	// unavailable: the credential cannot take requests now (breaker open, paused, no longer
	// configured) or never this one (too large), so a job with a fallback moves on instead.
	unavailable bool
	// stored: until is not to be written to the job row: it is already there (a retry delay, a
	// held limiter slot), or the row is another delivery's (leasedDefer).
	stored bool
	// elsewhere: the credential is known to another process's config and not to this one's (a
	// rolling deploy that adds it): the job waits for that process as it would for a paused
	// credential, without failing over.
	elsewhere bool
	// credential is the job's credential index the delivery read (jobs.Job.CredentialIndex),
	// and read says it is set (run sets it on every deferral not stored): the row takes until
	// only while the job is still there. Another delivery that failed the job over meanwhile
	// owns the row (its fallback takes the job at once): this one comes back at until, and
	// finds the job moved.
	credential int
	read       bool
	// turnedAway: the delivery was turned away for its tenant's share of the slots (takeShare),
	// and pauses for turnAwayPause once its deferral is written and its gate place left.
	turnedAway bool
}

// onCredential reports whether the deferral waits for the job's credential to take requests
// again (paused, its breaker open, not in this process's config), not for the job's turn on it:
// a job whose last attempt was lost then shows it waits (jobs.Store.WaitForCredential).
func (d *deferral) onCredential() bool { return d.unavailable || d.elsewhere }

func (d *deferral) Error() string {
	return fmt.Sprintf("deferred until %s: %s", d.until.Format(time.RFC3339Nano), d.reason)
}

// Process runs one delivery of a job (dispatch.Processor). It returns nil when the job needs
// nothing more from this delivery, a *dispatch.DeferError when it must come back later, and
// another error when the stores failed (dispatch retries the delivery).
func (e *Executor) Process(ctx context.Context, d dispatch.Delivery) error {
	pass := &gatePass{g: e.backlog}
	defer pass.leave()
	if d.Low {
		if err := pass.enter(ctx); err != nil {
			return err
		}
	}
	err := e.process(ctx, d.JobID, d.Retried == 0, pass, true)
	df, _ := errors.AsType[*deferral](err)
	err = e.outcome(ctx, d.JobID, err)
	if _, ok := errors.AsType[*dispatch.DeferError](err); ok {
		e.cfg.Metrics.deferred() // not in ProcessFresh: its delivery reads no job either
	}
	if df != nil && df.turnedAway {
		// The pause of a delivery turned away for its tenant's share (see turnAwayPause) comes
		// after its deferral's write and out of the backlog gate: it holds asynq's slot only,
		// and no other delivery waits for it. Its answer is settled (the deferral written, or
		// the write's error): a ctx that ends in the pause changes nothing of it.
		pass.leave()
		_ = e.turnAwaySleep(ctx, turnAwayPause)
	}
	return err
}

// ProcessFresh runs the first delivery of a job its caller has just created, in this process
// and without an asynq task (dispatch.Handoff): job is the one jobs.Store.Create returned (with
// its request), adm AdmitFirst's admission for it (nil: none). The job is not read again (it
// was committed a moment ago; the attempt's start is conditional on its state all the same).
// It answers as Process does.
func (e *Executor) ProcessFresh(ctx context.Context, job *jobs.Job, adm dispatch.Admission) error {
	e.cfg.Metrics.stage(StagePickup, e.cfg.Now().Sub(job.CreatedAt))
	if a, ok := adm.(*FirstAdmission); ok && a != nil {
		return e.outcome(ctx, job.ID, e.runAdmitted(ctx, job, a))
	}
	pass := &gatePass{g: e.backlog}
	defer pass.leave()
	return e.outcome(ctx, job.ID, e.run(ctx, job, pass))
}

// outcome is what a delivery of job id that ended with err answers (see Process): a deferral
// not yet in the job row is written there first.
func (e *Executor) outcome(ctx context.Context, id string, err error) error {
	if errors.Is(err, errHandled) {
		return nil
	}
	if df, ok := errors.AsType[*deferral](err); ok {
		if !df.stored {
			// asynq keeps whole seconds and may hand the task back up to a second early; with
			// the time in the row, that delivery sleeps the rest instead of being deferred
			// again (which, for every waiting job, would spin while a breaker is open).
			pctx, cancel := e.storeCtx(context.WithoutCancel(ctx))
			var perr error
			if df.onCredential() {
				// A job whose last attempt's delivery died is moved to retrying: it would stay
				// running, a call in flight that is not, for as long as the credential cannot
				// take it. A wait for its turn is short and leaves it running, which keeps its
				// next attempt off the retry budget (drawsOnRetryBudget).
				perr = e.cfg.Store.WaitForCredential(pctx, id, df.credential, df.until, df.reason)
			} else {
				perr = e.cfg.Store.Postpone(pctx, id, df.credential, df.until)
			}
			cancel()
			if perr != nil {
				return perr
			}
		}
		return &dispatch.DeferError{Until: df.until, Reason: df.reason}
	}
	return err
}

// storeCtx is ctx bounded by Config.StoreTimeout, for one statement of a delivery (see there).
func (e *Executor) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.cfg.StoreTimeout)
}

// process is one delivery, step by step (see the package comment). fresh is false when dispatch
// handed the task back after an earlier delivery's error. A low job's steps before the call go
// through the backlog gate (pass; a task from the low queue entered it before the load). With
// Config.Slots and share set, the delivery holds a slot of its tenant's share from the load to
// its end; a failover's nested delivery (share false) runs in the slot its delivery holds.
func (e *Executor) process(ctx context.Context, id string, fresh bool, pass *gatePass, share bool) error {
	job, err := e.load(ctx, id, fresh)
	if err != nil {
		return err
	}
	if share && e.shares != nil {
		took, err := e.takeShare(ctx, job)
		if err != nil {
			return err
		}
		if took {
			defer e.shares.Release(job.Tenant) // every way out: an end, a deferral, an error, a panic
		}
	}
	return e.run(ctx, job, pass)
}

// run is a delivery's steps after the job's read (see steps). A deferral for outcome to write
// records the credential the job was read at: the write applies only while the job is there.
func (e *Executor) run(ctx context.Context, job *jobs.Job, pass *gatePass) error {
	err := e.steps(ctx, job, pass)
	if d, ok := errors.AsType[*deferral](err); ok && !d.stored && !d.read {
		// Not read yet: a failover's nested delivery read the job again, and its record stands.
		d.credential, d.read = job.CredentialIndex, true
	}
	return err
}

// steps are run's: the guard, the breaker and the limiter, the attempt's start and the attempt.
func (e *Executor) steps(ctx context.Context, job *jobs.Job, pass *gatePass) error {
	if job.Priority == jobs.PriorityLow {
		// A low job's due task comes on the main queue: it enters here.
		if err := pass.enter(ctx); err != nil {
			return err
		}
	}
	up, paused, err := e.guard(ctx, job, pass)
	if err != nil {
		return err
	}
	adm, err := e.clear(ctx, job, up, paused, pass)
	if err != nil {
		return err
	}
	e.logMoves(ctx, job.ID, pass)
	pass.leave()
	job, err = e.begin(ctx, job, up, adm)
	if err != nil {
		return err
	}
	return e.attempt(ctx, job, up, adm)
}
