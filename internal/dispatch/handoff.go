package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/gostack"
	"github.com/llmq/llmq/internal/jobs"
)

// FreshProcessor runs the first delivery of a job created in this process (executor.Executor).
type FreshProcessor interface {
	// AdmitFirst asks, before job is created (jobs.Store.Prepare's job), for its first
	// attempt's admission, without waiting: nil when none was had at once (the delivery asks
	// again). Its Begin says whether the job is to be created with the attempt started.
	AdmitFirst(ctx context.Context, job *jobs.Job) Admission
	// ProcessFresh runs the first delivery of job, as created, with AdmitFirst's admission (nil:
	// none): nil when the job needs nothing more from it, a *DeferError when it must come back
	// later, another error when the stores failed.
	ProcessFresh(ctx context.Context, job *jobs.Job, adm Admission) error
}

// Admission is a new job's first attempt admitted before the job was created
// (FreshProcessor.AdmitFirst): a rate-limit slot and the breaker's admission, for the delivery
// that runs the job.
type Admission interface {
	// Begin is the attempt's start to create the job with (what jobs.CreateParams.Admit
	// answers), or nil when the slot is not due yet: the job is created queued and the delivery
	// starts the attempt when it is.
	Begin() *jobs.Begin
	// Release gives back what the admission holds, for a job that was not created (its create
	// failed, or it was a replay): its breaker admission and its reserved tokens.
	Release(ctx context.Context)
}

// HandoffConfig configures a Handoff.
type HandoffConfig struct {
	// Processor runs the deliveries. Required.
	Processor FreshProcessor
	// Enqueuer takes the jobs whose delivery must come back (a deferral, a failure of the
	// stores, a shutdown) as asynq tasks. Required.
	Enqueuer *Enqueuer
	// Redis is asynq's Redis, whose cancelation channel (Tasks.Abort) ends a running delivery
	// of a canceled job. Nil: only a shutdown ends one.
	Redis redis.UniversalClient
	// Slots is how many deliveries run at once; a job offered while all are taken is declined
	// (its submit enqueues it). Default 1.
	Slots int
	// ShutdownTimeout is how long Run waits, once its context ends, for the deliveries running
	// to finish before it cancels them and hands their jobs to asynq. Default 10s (asynq's
	// shutdown timeout in a worker).
	ShutdownTimeout time.Duration
	// CutGrace bounds how long Run waits, once it has canceled the deliveries still running at
	// ShutdownTimeout, for them to record their attempts and hand their jobs back. Default
	// CutGrace, as a Server's.
	CutGrace time.Duration
	// Logger receives the deliveries that failed and handbacks that did not reach asynq.
	// Default discards.
	Logger *slog.Logger
	// Metrics, when set, counts the offers by outcome (llmq_worker_handoffs_total).
	Metrics *Metrics
	// Now is the clock that starts the deliveries' shared deadlines (see Claim.Start). Default
	// time.Now.
	Now func() time.Time
}

// deliveryWindow is how long the deliveries started one after another share one deadline
// (Claim.Start): each is given taskTimeout from its start, and at most deliveryWindow more.
const deliveryWindow = time.Minute

// Handoff runs the first delivery of a job submitted to this process's API in this process,
// without an asynq task: the submit's enqueue, the task's dequeue and acknowledgement and the
// delivery's read of the job are not needed (llmq serve, where the API and a worker share a
// process; docs/decisions.md, *A serve process runs the first delivery of its own submits*).
//
// A job with no task is the sweeper's to find; its grace for fresh jobs (SweeperConfig.
// FreshGrace) keeps it from enqueuing a job a Handoff is running. Every delivery that must come
// back goes to asynq as a task: a deferral at its time, a failure of the stores at once, a
// delivery canceled by a shutdown at once (its attempt's lease, if it took one, makes the next
// delivery wait). A delivery of a job canceled by its owner (Tasks.Abort) ends at once, as a
// task's does, and comes back only when it had deferred the job: at once, for the delivery that
// gives back a limiter slot the row may hold (Tasks.AbortHeld). If the process dies, the sweeper
// enqueues the job after the grace. Safe for concurrent use.
type Handoff struct {
	cfg   HandoffConfig
	slots chan struct{}
	// base is every delivery's parent context; stop cancels it (a shutdown past its timeout).
	base context.Context
	stop context.CancelFunc

	mu      sync.Mutex
	closed  bool
	running map[string]*handoffRun // by job ID
	wg      sync.WaitGroup
	// window is the parent of the deliveries started before windowEnd, which its deadline bounds
	// (Claim.Start); windowStop is its cancel, left to its timer (its deliveries may outlive the
	// window) or to base's.
	window     context.Context
	windowStop context.CancelFunc
	windowEnd  time.Time
}

// handoffRun is a delivery in progress.
type handoffRun struct {
	cancel  context.CancelFunc
	aborted bool // canceled through the cancelation channel: the job was canceled
}

// NewHandoff returns a Handoff. It panics when Processor or Enqueuer is nil (a wiring bug).
func NewHandoff(cfg HandoffConfig) *Handoff {
	if cfg.Processor == nil || cfg.Enqueuer == nil {
		panic("dispatch.NewHandoff: Processor and Enqueuer are required")
	}
	if cfg.Slots <= 0 {
		cfg.Slots = 1
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.CutGrace <= 0 {
		cfg.CutGrace = CutGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	base, stop := context.WithCancel(context.Background())
	return &Handoff{cfg: cfg, slots: make(chan struct{}, cfg.Slots), base: base, stop: stop,
		running: map[string]*handoffRun{}}
}

// Claim takes a delivery slot for a job of priority p on lane, about to be created. It returns
// nil, and the caller creates and enqueues the job, for a low job (they wait behind the others
// on their own asynq queue), a batch-lane job, when every slot is taken, or once Run is
// shutting down. Every Claim returned must be started (Claim.Start) or dropped (Claim.Drop). A
// nil *Handoff declines every job. A nil answer is not counted: the job may turn out a replay,
// or not be created; the caller counts the decline once it has created and enqueued the job
// (Declined).
func (h *Handoff) Claim(p jobs.Priority, lane jobs.Lane) *Claim {
	if h == nil || p == jobs.PriorityLow || lane == jobs.LaneBatch {
		return nil
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	select {
	case h.slots <- struct{}{}:
	default:
		h.mu.Unlock()
		return nil
	}
	h.wg.Add(1) // Run's shutdown waits for the claim to start or drop
	h.mu.Unlock()
	return &Claim{h: h}
}

// Declined counts a job Claim declined (a nil Claim) that was then created, new, and is to be
// enqueued as a task (llmq_worker_handoffs_total{outcome="declined"}). Not for a replay, a job
// whose create failed or a batch-lane job (the batcher's, never offered). A nil *Handoff counts
// nothing.
func (h *Handoff) Declined() {
	if h != nil {
		h.cfg.Metrics.handoff(handoffDeclined)
	}
}

// Claim is a delivery slot of a Handoff taken for a job about to be created, and the job's
// first attempt's admission once asked (Claim.Admit). Start or Drop it, once.
type Claim struct {
	h   *Handoff
	adm Admission // nil: none (yet)
}

// Admit asks the processor for the first attempt's admission of job, the job about to be
// created (jobs.CreateParams.Admit, whose signature it has), keeps it for the delivery, and
// returns the attempt's start to insert with the job (nil: the job is created queued). A panic
// in the processor means no admission (the delivery asks again), not a lost slot. Call it at
// most once.
func (c *Claim) Admit(ctx context.Context, job *jobs.Job) (begin *jobs.Begin) {
	defer func() {
		if r := recover(); r != nil {
			c.h.cfg.Logger.Error("panic in a first attempt's admission; the delivery asks again", "job_id", job.ID, "panic", r)
			c.adm, begin = nil, nil
		}
	}()
	c.adm = c.h.cfg.Processor.AdmitFirst(ctx, job)
	if c.adm == nil {
		return nil
	}
	return c.adm.Begin()
}

// Start runs the first delivery of job, the one jobs.Store.Create returned (with its request,
// committed, with no task), in the claimed slot. The delivery is bounded as a task's is
// (taskTimeout, asynq's task timeout), the backstop of its waits; the deliveries started within
// a deliveryWindow share that deadline (each has taskTimeout at least, and deliveryWindow more at
// most), so that a delivery's context makes no timer: its own, made at every job, was 2 of its
// allocations and a timer set and stopped.
func (c *Claim) Start(job *jobs.Job) {
	h := c.h
	now := h.cfg.Now()
	h.mu.Lock()
	if !now.Before(h.windowEnd) {
		h.windowEnd = now.Add(deliveryWindow)
		h.window, h.windowStop = context.WithDeadline(h.base, h.windowEnd.Add(taskTimeout))
	}
	ctx, cancel := context.WithCancel(h.window)
	run := &handoffRun{cancel: cancel}
	h.running[job.ID] = run
	h.mu.Unlock()
	h.cfg.Metrics.handoff(handoffTaken)
	go h.deliver(ctx, job, c.adm, run)
}

// Drop frees the slot and releases the admission, if any: the job was not created (its create
// failed, or it is a replay of an existing job).
func (c *Claim) Drop(ctx context.Context) {
	if c.adm != nil {
		c.adm.Release(ctx)
	}
	<-c.h.slots
	c.h.wg.Done()
}

// deliver runs job's delivery and hands the job to asynq when it must come back.
func (h *Handoff) deliver(ctx context.Context, job *jobs.Job, adm Admission, run *handoffRun) {
	gostack.Grow() // a goroutine per delivery: its stack grown once, while shallow
	defer h.wg.Done()
	err := h.process(ctx, job, adm)
	h.mu.Lock()
	delete(h.running, job.ID)
	aborted := run.aborted
	h.mu.Unlock()
	run.cancel()
	<-h.slots
	var d *DeferError
	deferred := errors.As(err, &d)
	if err == nil || aborted && !deferred {
		return // done, or canceled by its owner (Postgres says so; nothing comes back)
	}
	var at time.Time
	switch {
	case aborted:
		// Its job ended (canceled) after the delivery deferred it, which may have held a limiter
		// slot in the job row: only a delivery gives that back (see executor), and with no task
		// the abort (Tasks.AbortHeld) found none to run. Handed back at once, it finds the job
		// ended and gives the slot back, or does nothing more than read the job.
	case deferred:
		at = d.Until
	case h.base.Err() != nil:
		h.cfg.Logger.Info("a handed-over delivery was cut by the shutdown; its job goes to asynq", "job_id", job.ID)
	default:
		h.cfg.Logger.Warn("a handed-over delivery failed; its job goes to asynq", "job_id", job.ID, "error", err)
	}
	h.cfg.Metrics.handoff(handoffReturned)
	ectx, cancel := context.WithTimeout(context.Background(), handbackTimeout)
	defer cancel()
	if err := h.cfg.Enqueuer.Enqueue(ectx, job.ID, job.Priority, at); err != nil {
		h.cfg.Logger.Error("hand a job back to asynq; the sweeper will enqueue it", "job_id", job.ID, "error", err)
	}
}

// handbackTimeout bounds the enqueue of a job whose handed-over delivery must come back.
const handbackTimeout = 5 * time.Second

// process runs the delivery, turning a panic into an error (asynq recovers a handler's panic
// the same way), so that the job goes back to asynq instead of taking the process down.
func (h *Handoff) process(ctx context.Context, job *jobs.Job, adm Admission) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in a handed-over delivery: %v", r)
		}
	}()
	return h.cfg.Processor.ProcessFresh(ctx, job, adm)
}

// Run listens on asynq's cancelation channel until ctx ends, ending the delivery of a job whose
// owner canceled it. Then it declines every offer, waits up to ShutdownTimeout for the
// deliveries running, cancels the rest and returns once each has ended and its job is handed
// to asynq (the Enqueuer's client must stay open until then), or after CutGrace more: a
// delivery that cannot record its attempt by then (Postgres unreachable: the executor would
// keep trying for 30 s) is left to its job's lease and the sweeper, as a Server leaves one, so
// that a stopping process is not held past its orchestrator's grace period.
func (h *Handoff) Run(ctx context.Context) error {
	var listenErr error
	if h.cfg.Redis != nil {
		listenErr = h.listen(ctx)
	}
	if listenErr != nil {
		// Deliveries still run; only a canceled job's call goes on until its lease ends.
		h.cfg.Logger.Error("asynq's cancelation channel: a canceled job's handed-over delivery is no longer stopped at once", "error", listenErr)
	}
	<-ctx.Done()
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	done := make(chan struct{})
	go func() {
		h.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(h.cfg.ShutdownTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		h.stop()
		g := time.NewTimer(h.cfg.CutGrace)
		defer g.Stop()
		select {
		case <-done:
		case <-g.C:
			h.mu.Lock()
			n := len(h.running)
			h.mu.Unlock()
			h.cfg.Logger.Warn("handed-over deliveries cut by the shutdown did not return in time; their jobs wait for their leases",
				"deliveries", n, "waited", h.cfg.CutGrace.String())
		}
	}
	h.stop()
	return listenErr
}

// listen cancels the deliveries named on asynq's cancelation channel until ctx ends. A lost
// subscription is taken again (go-redis resubscribes); a cancelation sent meanwhile is missed,
// as a task's would be, and the job's attempt ends when its lease is not renewed.
func (h *Handoff) listen(ctx context.Context) error {
	sub := h.cfg.Redis.Subscribe(ctx, asynqCancelChannel)
	defer sub.Close()
	msgs := sub.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m, ok := <-msgs:
			if !ok {
				return errors.New("asynq's cancelation channel closed")
			}
			h.abort(m.Payload)
		}
	}
}

// abort cancels the delivery of job id, if this Handoff runs one.
func (h *Handoff) abort(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if run, ok := h.running[id]; ok {
		run.aborted = true
		run.cancel()
	}
}

// asynqCancelChannel is the Pub/Sub channel on which asynq v0.26's Inspector.CancelProcessing
// names the task to cancel (base.CancelChannel, not exported). TestHandoff_CanceledByAbort fails
// if a new asynq version moves it.
const asynqCancelChannel = "asynq:cancel"
