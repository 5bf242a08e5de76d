package dispatch_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// waitFor bounds every wait of the Handoff tests; tick is how often a condition is polled.
const (
	waitFor = 30 * time.Second
	tick    = 5 * time.Millisecond
)

// fakeProcessor is a dispatch.FreshProcessor whose deliveries run fn. It reports each job it is
// given on started, before fn runs, and counts its calls; its AdmitFirst answers admit's
// admission (nil: none), and each delivery's admission goes to admissions.
type fakeProcessor struct {
	fn         func(ctx context.Context, job *jobs.Job) error
	admit      func(job *jobs.Job) dispatch.Admission
	started    chan *jobs.Job
	admissions chan dispatch.Admission
	calls      atomic.Int32
}

func newFakeProcessor(fn func(ctx context.Context, job *jobs.Job) error) *fakeProcessor {
	return &fakeProcessor{fn: fn, started: make(chan *jobs.Job, 16), admissions: make(chan dispatch.Admission, 16)}
}

func (p *fakeProcessor) AdmitFirst(_ context.Context, job *jobs.Job) dispatch.Admission {
	if p.admit == nil {
		return nil
	}
	return p.admit(job)
}

func (p *fakeProcessor) ProcessFresh(ctx context.Context, job *jobs.Job, adm dispatch.Admission) error {
	p.calls.Add(1)
	p.admissions <- adm
	p.started <- job
	return p.fn(ctx, job)
}

// fakeAdmission is a dispatch.Admission that counts its releases.
type fakeAdmission struct {
	begin    *jobs.Begin
	released atomic.Int32
}

func (a *fakeAdmission) Begin() *jobs.Begin      { return a.begin }
func (a *fakeAdmission) Release(context.Context) { a.released.Add(1) }

// offer claims a slot of h for job and, when it got one, asks for its admission and starts
// job's delivery in it, as the API does around the job's insert; when it got none, it counts
// the decline of a job not batch-lane, as the API does. It reports whether it got a slot.
func offer(t *testing.T, h *dispatch.Handoff, job *jobs.Job) bool {
	t.Helper()
	c := h.Claim(job.Priority, job.Lane)
	if c == nil {
		if job.Lane != jobs.LaneBatch {
			h.Declined() // as the API does once it has created the job, to enqueue it
		}
		return false
	}
	c.Admit(t.Context(), job)
	c.Start(job)
	return true
}

// next returns the next job a delivery was started for, failing the test if none starts in time.
func (p *fakeProcessor) next(t *testing.T) *jobs.Job {
	t.Helper()
	select {
	case job := <-p.started:
		return job
	case <-time.After(waitFor):
		t.Fatal("no delivery started")
		return nil
	}
}

// handoffBundle is a Handoff on a queue of its own, with its Run running, and the metrics it
// counts on.
type handoffBundle struct {
	*tasksBundle
	h   *dispatch.Handoff
	reg *prometheus.Registry

	stopOnce sync.Once
	cancel   context.CancelFunc
	runDone  chan error
	runErr   error
}

// setupHandoff builds a Handoff from cfg with p as its processor, the bundle's enqueuer, asynq's
// Redis and metrics of its own, and starts its Run; the test's end stops it (see stop).
func setupHandoff(t *testing.T, p dispatch.FreshProcessor, cfg dispatch.HandoffConfig) *handoffBundle {
	t.Helper()
	tb := setupTasks(t)
	reg := prometheus.NewRegistry()
	cfg.Processor, cfg.Enqueuer, cfg.Redis, cfg.Metrics = p, tb.enqueuer, redistest.Client(t), dispatch.NewMetrics(reg)
	b := &handoffBundle{tasksBundle: tb, h: dispatch.NewHandoff(cfg), reg: reg, runDone: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	go func() { b.runDone <- b.h.Run(ctx) }()
	// Registered after the clients' cleanups, so it runs before them: the handbacks of a shutdown
	// go through the asynq client.
	t.Cleanup(func() { b.stop(t) })
	return b
}

// stop cancels Run's context and waits for Run to return (every delivery ended and handed
// back), failing the test if it does not in time or returns an error. Later calls do nothing.
func (b *handoffBundle) stop(t *testing.T) {
	t.Helper()
	b.stopOnce.Do(func() {
		b.cancel()
		select {
		case b.runErr = <-b.runDone:
		case <-time.After(waitFor):
			b.runErr = errors.New("Run did not return")
		}
	})
	require.NoError(t, b.runErr)
}

// requireRunWaits fails the test if Run, whose context was canceled, returns within 100 ms
// (what it waits for is named by why); Run's answer is kept for stop.
func (b *handoffBundle) requireRunWaits(t *testing.T, why string) {
	t.Helper()
	select {
	case err := <-b.runDone:
		b.runDone <- err // for stop
		t.Fatalf("Run returned (%v) %s", err, why)
	case <-time.After(100 * time.Millisecond):
	}
}

// handoffs returns llmq_worker_handoffs_total{outcome=outcome}.
func (b *handoffBundle) handoffs(t *testing.T, outcome string) float64 {
	t.Helper()
	return labeledCounter(t, b.reg, "llmq_worker_handoffs_total", "outcome", outcome)
}

// labeledCounter returns the counter name{label=value} of reg; the test fails when there is none.
func labeledCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// requireHandoffs checks the three counts of llmq_worker_handoffs_total.
func (b *handoffBundle) requireHandoffs(t *testing.T, taken, declined, returned float64) {
	t.Helper()
	require.Equal(t, map[string]float64{"taken": taken, "declined": declined, "returned": returned},
		map[string]float64{"taken": b.handoffs(t, "taken"), "declined": b.handoffs(t, "declined"),
			"returned": b.handoffs(t, "returned")})
}

// tasksOfJob returns the state of every asynq task of job id, keyed by queue and task ID, on
// each queue where one may wait: under the job's ID on the main and the low queue, and as its
// due task on the main queue. A queue asynq has never seen holds none.
func (b *handoffBundle) tasksOfJob(t *testing.T, id string) map[string]asynq.TaskState {
	t.Helper()
	out, err := b.readTasksOfJob(id)
	require.NoError(t, err)
	return out
}

// hasTask reports whether job id has an asynq task (for require.Eventually, whose condition
// runs outside the test's goroutine: an error is no task yet).
func (b *handoffBundle) hasTask(id string) bool {
	out, err := b.readTasksOfJob(id)
	return err == nil && len(out) > 0
}

// readTasksOfJob is tasksOfJob, returning its error.
func (b *handoffBundle) readTasksOfJob(id string) (map[string]asynq.TaskState, error) {
	out := map[string]asynq.TaskState{}
	for _, place := range [][2]string{{b.queue, id}, {b.queue + ":low", id}, {b.queue, id + ":due"}} {
		info, err := b.inspector.GetTaskInfo(place[0], place[1])
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[place[0]+"/"+place[1]] = info.State
	}
	return out, nil
}

// newJob is a job as the API offers it: the row Create returned, of which a Handoff reads the ID,
// the priority and the lane.
func newJob(p jobs.Priority, lane jobs.Lane) *jobs.Job {
	return &jobs.Job{ID: uuid.NewString(), Priority: p, Lane: lane, CreatedAt: time.Now()}
}

// TestHandoff_OfferedJobRunsWithoutTask checks that an offered job is taken: its delivery runs in
// the process with the job the API offered, no asynq task is made for it when the delivery needs
// nothing more, and the offer is counted as taken.
func TestHandoff_OfferedJobRunsWithoutTask(t *testing.T) {
	t.Parallel()
	p := newFakeProcessor(func(context.Context, *jobs.Job) error { return nil })
	b := setupHandoff(t, p, dispatch.HandoffConfig{})
	job := newJob(jobs.PriorityHigh, jobs.LaneOnline)

	require.True(t, offer(t, b.h, job))
	got := p.next(t)
	require.Equal(t, job.ID, got.ID)
	require.Same(t, job, got, "the delivery runs on the row the API offered, not a read of it")
	b.stop(t) // Run returns once the delivery has ended (and anything it handed back is in asynq)
	require.Empty(t, b.tasksOfJob(t, job.ID), "a delivery that needs nothing more leaves no task")
	require.EqualValues(t, 1, p.calls.Load())
	b.requireHandoffs(t, 1, 0, 0)
}

// TestHandoff_DeliveriesShareADeadline: a handed-over delivery is bounded as a task is (an hour,
// asynq's task timeout, from its start), by a deadline the deliveries started within a minute
// share: each delivery made a timer of its own (2 allocations and a timer set and stopped a job).
// A delivery started past the minute gets a deadline of its own window.
func TestHandoff_DeliveriesShareADeadline(t *testing.T) {
	t.Parallel()
	deadlines := make(chan time.Time, 3)
	p := newFakeProcessor(func(ctx context.Context, _ *jobs.Job) error {
		d, _ := ctx.Deadline() // none: the zero time, which no check below expects
		deadlines <- d
		return nil
	})
	start := time.Now()
	var clock atomic.Int64 // the time past start
	b := setupHandoff(t, p, dispatch.HandoffConfig{Slots: 3,
		Now: func() time.Time { return start.Add(time.Duration(clock.Load())) }})
	deadline := func() time.Time {
		t.Helper()
		p.next(t)
		select {
		case d := <-deadlines:
			return d
		case <-time.After(waitFor):
			t.Fatal("no deadline")
			return time.Time{}
		}
	}

	require.True(t, offer(t, b.h, newJob(jobs.PriorityHigh, jobs.LaneOnline)))
	first := deadline()
	require.Equal(t, start.Add(time.Minute+time.Hour), first)
	clock.Store(int64(59 * time.Second))
	require.True(t, offer(t, b.h, newJob(jobs.PriorityHigh, jobs.LaneOnline)))
	require.Equal(t, first, deadline(), "within the minute: the same deadline, an hour at least")
	clock.Store(int64(time.Minute))
	require.True(t, offer(t, b.h, newJob(jobs.PriorityHigh, jobs.LaneOnline)))
	require.Equal(t, start.Add(2*time.Minute+time.Hour), deadline(), "past it: a window of its own")
}

// TestHandoff_DeclinesWhenSlotsTaken checks that an offer made while every slot is taken by a
// running delivery is declined (counted), without a delivery, and that the slot is free again
// once its delivery ends.
func TestHandoff_DeclinesWhenSlotsTaken(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	p := newFakeProcessor(func(ctx context.Context, job *jobs.Job) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	b := setupHandoff(t, p, dispatch.HandoffConfig{Slots: 1})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the bundle's stop: a failed test does not wait for its shutdown timeout

	first, second := newJob(jobs.PriorityNormal, jobs.LaneOnline), newJob(jobs.PriorityNormal, jobs.LaneOnline)
	require.True(t, offer(t, b.h, first))
	require.Equal(t, first.ID, p.next(t).ID) // the slot is held while the delivery runs
	require.False(t, offer(t, b.h, second), "the only slot is taken")
	b.requireHandoffs(t, 1, 1, 0)

	// Once the first delivery ends, its slot takes the next offer.
	free()
	third := newJob(jobs.PriorityNormal, jobs.LaneOnline)
	require.Eventually(t, func() bool { return offer(t, b.h, third) }, waitFor, tick, "the slot was never freed")
	require.Equal(t, third.ID, p.next(t).ID)
	b.stop(t)
	require.EqualValues(t, 2, p.calls.Load(), "the declined job was not delivered")
	require.Empty(t, b.tasksOfJob(t, second.ID), "a declined job is its submit's to enqueue")
}

// TestHandoff_DeclinesLowAndBatchJobs checks that a low job (it waits on its own asynq queue) and
// a batch-lane job (the batcher's) are declined even with a slot free, and never delivered; a
// normal job offered next is taken, so the slot was free.
func TestHandoff_DeclinesLowAndBatchJobs(t *testing.T) {
	t.Parallel()
	p := newFakeProcessor(func(context.Context, *jobs.Job) error { return nil })
	b := setupHandoff(t, p, dispatch.HandoffConfig{Slots: 1})

	low, batch := newJob(jobs.PriorityLow, jobs.LaneOnline), newJob(jobs.PriorityNormal, jobs.LaneBatch)
	require.False(t, offer(t, b.h, low), "a low job")
	require.False(t, offer(t, b.h, batch), "a batch-lane job")
	require.Zero(t, b.handoffs(t, "taken"))
	require.EqualValues(t, 1, b.handoffs(t, "declined"), "the low job is counted: its submit enqueues it; the batcher collects the other")

	normal := newJob(jobs.PriorityNormal, jobs.LaneOnline)
	require.True(t, offer(t, b.h, normal), "the slot is free")
	require.Equal(t, normal.ID, p.next(t).ID)
	b.stop(t)
	require.EqualValues(t, 1, p.calls.Load(), "only the normal job was delivered")
	require.Empty(t, b.tasksOfJob(t, low.ID))
	require.Empty(t, b.tasksOfJob(t, batch.ID))
}

// TestHandoff_DeferralBecomesScheduledTask checks that a delivery deferred (a *DeferError) goes
// to asynq as the job's task, scheduled at the deferral's time (asynq keeps whole seconds), and
// that the offer is counted as returned.
func TestHandoff_DeferralBecomesScheduledTask(t *testing.T) {
	t.Parallel()
	until := time.Now().Add(time.Hour)
	p := newFakeProcessor(func(context.Context, *jobs.Job) error {
		return &dispatch.DeferError{Until: until, Reason: "the limiter's turn"}
	})
	b := setupHandoff(t, p, dispatch.HandoffConfig{})
	job := newJob(jobs.PriorityNormal, jobs.LaneOnline)

	require.True(t, offer(t, b.h, job))
	require.Equal(t, job.ID, p.next(t).ID)
	require.Eventually(t, func() bool { return b.hasTask(job.ID) }, waitFor, tick, "no task was enqueued")
	b.stop(t)
	require.Equal(t, map[string]asynq.TaskState{b.queue + "/" + job.ID: asynq.TaskStateScheduled}, b.tasksOfJob(t, job.ID))
	info, err := b.inspector.GetTaskInfo(b.queue, job.ID)
	require.NoError(t, err)
	require.Equal(t, until.Unix(), info.NextProcessAt.Unix(), "scheduled at the deferral's time")
	require.Equal(t, dispatch.TaskType, info.Type)
	require.Equal(t, job.ID, string(info.Payload), "a task the workers deliver like any other")
	b.requireHandoffs(t, 1, 0, 1)
}

// TestHandoff_FailedDeliveryGoesBackAtOnce checks that a delivery that fails (the stores) or
// panics hands its job to asynq as a task due at once, counted as returned, and that a panic does
// not take the process down.
func TestHandoff_FailedDeliveryGoesBackAtOnce(t *testing.T) {
	t.Parallel()
	for name, fn := range map[string]func(context.Context, *jobs.Job) error{
		"Error": func(context.Context, *jobs.Job) error { return errors.New("postgres unreachable") },
		"Panic": func(context.Context, *jobs.Job) error { panic("a bug in a delivery") },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := newFakeProcessor(fn)
			b := setupHandoff(t, p, dispatch.HandoffConfig{})
			job := newJob(jobs.PriorityNormal, jobs.LaneOnline)

			require.True(t, offer(t, b.h, job))
			require.Equal(t, job.ID, p.next(t).ID)
			require.Eventually(t, func() bool { return b.hasTask(job.ID) }, waitFor, tick, "no task was enqueued")
			b.stop(t)
			require.Equal(t, map[string]asynq.TaskState{b.queue + "/" + job.ID: asynq.TaskStatePending}, b.tasksOfJob(t, job.ID))
			b.requireHandoffs(t, 1, 0, 1)
		})
	}
}

// TestHandoff_CanceledByAbort checks that Tasks.Abort, which signals asynq's cancelation channel,
// ends the running delivery of the job it names (and only that one), and that the aborted job is
// not handed back to asynq: its owner canceled it. It fails if asynq moves its channel.
func TestHandoff_CanceledByAbort(t *testing.T) {
	t.Parallel()
	aborted, other := newJob(jobs.PriorityNormal, jobs.LaneOnline), newJob(jobs.PriorityNormal, jobs.LaneOnline)
	ended := make(chan error, 1)         // the aborted delivery's ctx.Err()
	abortsDone := make(chan struct{})    // the test's last Abort has returned
	releaseOther := make(chan struct{})  // the other delivery may end
	otherEnded := make(chan struct{}, 1) // the other delivery's ctx ended before it was released
	p := newFakeProcessor(func(ctx context.Context, job *jobs.Job) error {
		if job.ID == other.ID {
			select {
			case <-releaseOther:
				return nil
			case <-ctx.Done():
				otherEnded <- struct{}{}
				return ctx.Err()
			}
		}
		<-ctx.Done()
		ended <- ctx.Err()
		// Return (and let the Handoff decide about a handback) only after the test's last Abort,
		// whose deletion of waiting tasks would otherwise hide a task handed back.
		<-abortsDone
		return ctx.Err()
	})
	// A short shutdown timeout: a failed test's stop does not wait for the blocked delivery.
	b := setupHandoff(t, p, dispatch.HandoffConfig{Slots: 2, ShutdownTimeout: time.Second})
	var once sync.Once
	finish := func() { once.Do(func() { close(abortsDone); close(releaseOther) }) }
	t.Cleanup(finish)

	require.True(t, offer(t, b.h, aborted))
	require.True(t, offer(t, b.h, other))
	started := map[string]bool{p.next(t).ID: true, p.next(t).ID: true}
	require.Equal(t, map[string]bool{aborted.ID: true, other.ID: true}, started)

	// Run's subscription to the channel may not be in place yet: abort until the delivery ends.
	var endErr error
	require.Eventually(t, func() bool {
		if err := b.tasks.Abort(aborted.ID); err != nil {
			return false
		}
		select {
		case endErr = <-ended:
			return true
		default:
			return false
		}
	}, waitFor, 20*time.Millisecond, "the abort did not end the delivery")
	require.ErrorIs(t, endErr, context.Canceled)
	select {
	case <-otherEnded:
		t.Fatal("the abort ended another job's delivery")
	default:
	}
	finish()
	b.stop(t)
	require.Empty(t, b.tasksOfJob(t, aborted.ID), "an aborted job does not come back")
	require.Empty(t, b.tasksOfJob(t, other.ID))
	select {
	case <-otherEnded:
		t.Fatal("the other delivery was canceled")
	default:
	}
	b.requireHandoffs(t, 2, 0, 0)
}

// TestHandoff_AbortedDeferralGoesBackAtOnce checks that a delivery deferred after its job was
// canceled (the abort's signal ended its context after it held a limiter slot in the job row,
// say) hands the job to asynq as a task due at once: with no task, the abort found none to run,
// and only a delivery gives such a slot back (see executor).
func TestHandoff_AbortedDeferralGoesBackAtOnce(t *testing.T) {
	t.Parallel()
	ended := make(chan struct{})
	p := newFakeProcessor(func(ctx context.Context, job *jobs.Job) error {
		<-ctx.Done()
		close(ended)
		return &dispatch.DeferError{Until: time.Now().Add(time.Hour), Reason: "rate limit slot"}
	})
	b := setupHandoff(t, p, dispatch.HandoffConfig{ShutdownTimeout: time.Second})
	job := newJob(jobs.PriorityNormal, jobs.LaneOnline)
	require.True(t, offer(t, b.h, job))
	require.Equal(t, job.ID, p.next(t).ID)
	// Run's subscription to the channel may not be in place yet: abort until the delivery ends.
	require.Eventually(t, func() bool {
		if err := b.tasks.AbortHeld(job.ID); err != nil {
			return false
		}
		select {
		case <-ended:
			return true
		default:
			return false
		}
	}, waitFor, 20*time.Millisecond, "the abort did not end the delivery")
	b.stop(t)
	require.Equal(t, map[string]asynq.TaskState{b.queue + "/" + job.ID: asynq.TaskStatePending}, b.tasksOfJob(t, job.ID))
	b.requireHandoffs(t, 1, 0, 1)
}

// TestHandoff_ShutdownHandsBackRunningDeliveries checks that once Run's context ends, a delivery
// still running after ShutdownTimeout is canceled, its job handed to asynq at once (counted as
// returned), Run returns, and offers made afterwards are declined.
func TestHandoff_ShutdownHandsBackRunningDeliveries(t *testing.T) {
	t.Parallel()
	ended := make(chan error, 1)
	p := newFakeProcessor(func(ctx context.Context, _ *jobs.Job) error {
		<-ctx.Done()
		ended <- ctx.Err()
		return ctx.Err() // what the executor answers when its context ends (a shutdown)
	})
	b := setupHandoff(t, p, dispatch.HandoffConfig{ShutdownTimeout: 50 * time.Millisecond})
	job := newJob(jobs.PriorityNormal, jobs.LaneOnline)

	require.True(t, offer(t, b.h, job))
	require.Equal(t, job.ID, p.next(t).ID)
	b.stop(t) // fails unless Run returns in time
	select {
	case err := <-ended:
		require.ErrorIs(t, err, context.Canceled)
	default:
		t.Fatal("Run returned with the delivery still running")
	}
	require.Equal(t, map[string]asynq.TaskState{b.queue + "/" + job.ID: asynq.TaskStatePending}, b.tasksOfJob(t, job.ID),
		"the job is handed back, due at once")

	late := newJob(jobs.PriorityNormal, jobs.LaneOnline)
	require.False(t, offer(t, b.h, late), "offered after Run returned")
	require.EqualValues(t, 1, p.calls.Load())
	b.requireHandoffs(t, 1, 1, 1)
}

// TestHandoff_ShutdownBoundsTheWaitForCutDeliveries checks that Run, having canceled at
// ShutdownTimeout a delivery that then does not return (its attempt's record retrying while
// Postgres is unreachable, for up to 30 s in the executor), returns after CutGrace rather than
// holding the stopping process past its orchestrator's grace period, as a Server does.
func TestHandoff_ShutdownBoundsTheWaitForCutDeliveries(t *testing.T) {
	t.Parallel()
	recording := make(chan struct{})
	p := newFakeProcessor(func(ctx context.Context, _ *jobs.Job) error {
		<-ctx.Done()
		<-recording // still recording what came of its attempt
		return ctx.Err()
	})
	b := setupHandoff(t, p, dispatch.HandoffConfig{ShutdownTimeout: 50 * time.Millisecond, CutGrace: 100 * time.Millisecond})
	var once sync.Once
	recorded := func() { once.Do(func() { close(recording) }) }
	t.Cleanup(recorded) // a failed test does not leave the delivery blocked
	job := newJob(jobs.PriorityNormal, jobs.LaneOnline)

	require.True(t, offer(t, b.h, job))
	require.Equal(t, job.ID, p.next(t).ID)
	b.stop(t) // fails unless Run returns within waitFor, the delivery still recording
	// The delivery, once it returns, still hands its job back (the process has not closed its
	// client yet here); the test waits for it so as to leave nothing running.
	recorded()
	require.Eventually(t, func() bool { return b.hasTask(job.ID) }, waitFor, 10*time.Millisecond)
}

// TestHandoff_ShutdownWaitsForDeliveries checks that once Run's context ends, Run waits (within
// ShutdownTimeout) for a running delivery to end on its own rather than cancel it, and a delivery
// that ends so is not handed back.
func TestHandoff_ShutdownWaitsForDeliveries(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	ctxErr := make(chan error, 1) // the delivery's ctx.Err() when it ended
	p := newFakeProcessor(func(ctx context.Context, _ *jobs.Job) error {
		<-release // ignores ctx: a delivery finishing its attempt
		ctxErr <- ctx.Err()
		return nil
	})
	b := setupHandoff(t, p, dispatch.HandoffConfig{ShutdownTimeout: time.Minute})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	job := newJob(jobs.PriorityNormal, jobs.LaneOnline)

	require.True(t, offer(t, b.h, job))
	require.Equal(t, job.ID, p.next(t).ID)
	b.cancel()
	b.requireRunWaits(t, "with a delivery running, before its shutdown timeout")
	free()
	b.stop(t)
	select {
	case err := <-ctxErr:
		require.NoError(t, err, "the delivery was canceled within the shutdown timeout")
	default:
		t.Fatal("Run returned with the delivery still running")
	}
	require.Empty(t, b.tasksOfJob(t, job.ID), "a delivery that ended is not handed back")
	b.requireHandoffs(t, 1, 0, 0)
}

// TestHandoff_NilDeclines checks that a nil *Handoff (a worker built without one) declines every
// job, so that an API given it enqueues as it would without.
func TestHandoff_NilDeclines(t *testing.T) {
	t.Parallel()
	var h *dispatch.Handoff
	require.Nil(t, h.Claim(jobs.PriorityNormal, jobs.LaneOnline))
}

// TestHandoff_ClaimCarriesTheAdmission checks that a claim asks the processor for the job's
// first attempt's admission before the job exists, gives its Begin to the job's insert, and
// hands that admission to the delivery it starts, unreleased.
func TestHandoff_ClaimCarriesTheAdmission(t *testing.T) {
	t.Parallel()
	p := newFakeProcessor(func(context.Context, *jobs.Job) error { return nil })
	adm := &fakeAdmission{begin: &jobs.Begin{LeaseToken: uuid.NewString()}}
	var asked atomic.Pointer[jobs.Job]
	p.admit = func(job *jobs.Job) dispatch.Admission {
		asked.Store(job)
		return adm
	}
	b := setupHandoff(t, p, dispatch.HandoffConfig{})
	job := newJob(jobs.PriorityNormal, jobs.LaneOnline)

	c := b.h.Claim(job.Priority, job.Lane)
	require.NotNil(t, c)
	require.Nil(t, asked.Load(), "the admission is asked for once the job is known to be new")
	require.Same(t, adm.begin, c.Admit(t.Context(), job))
	require.Same(t, job, asked.Load(), "the admission was asked for the job about to be created")
	c.Start(job)
	require.Equal(t, job.ID, p.next(t).ID)
	require.Same(t, adm, <-p.admissions, "the delivery gets the claim's admission")
	b.stop(t)
	require.Zero(t, adm.released.Load(), "a started claim's admission is the delivery's")
	b.requireHandoffs(t, 1, 0, 0)
}

// TestHandoff_DropFreesTheSlotAndReleases checks that a dropped claim (its job was not created)
// releases its admission and frees its slot without a delivery, and that until then the slot
// is taken.
func TestHandoff_DropFreesTheSlotAndReleases(t *testing.T) {
	t.Parallel()
	p := newFakeProcessor(func(context.Context, *jobs.Job) error { return nil })
	adm := &fakeAdmission{}
	p.admit = func(*jobs.Job) dispatch.Admission { return adm }
	b := setupHandoff(t, p, dispatch.HandoffConfig{Slots: 1})

	job := newJob(jobs.PriorityNormal, jobs.LaneOnline)
	c := b.h.Claim(job.Priority, job.Lane)
	require.NotNil(t, c)
	require.Nil(t, c.Admit(t.Context(), job), "an admission whose slot is not due creates the job queued")
	require.Nil(t, b.h.Claim(jobs.PriorityNormal, jobs.LaneOnline), "the claim holds the only slot")
	c.Drop(t.Context())
	require.EqualValues(t, 1, adm.released.Load())
	next := newJob(jobs.PriorityNormal, jobs.LaneOnline)
	require.True(t, offer(t, b.h, next), "the dropped claim's slot is free")
	require.Equal(t, next.ID, p.next(t).ID)
	b.stop(t)
	require.EqualValues(t, 1, p.calls.Load(), "the dropped claim ran no delivery")
	b.requireHandoffs(t, 1, 0, 0) // the claim refused above was for no job created: not a decline
}

// TestHandoff_ShutdownWaitsForAClaim checks that Run's shutdown waits for a claim taken before it
// to be started or dropped (its submit is inserting the job), and that a panic in AdmitFirst
// costs the claim its admission, not its slot.
func TestHandoff_ShutdownWaitsForAClaim(t *testing.T) {
	t.Parallel()
	p := newFakeProcessor(func(context.Context, *jobs.Job) error { return nil })
	p.admit = func(*jobs.Job) dispatch.Admission { panic("a bug in an admission") }
	b := setupHandoff(t, p, dispatch.HandoffConfig{ShutdownTimeout: time.Minute})
	job := newJob(jobs.PriorityNormal, jobs.LaneOnline)

	c := b.h.Claim(job.Priority, job.Lane)
	require.NotNil(t, c)
	require.Nil(t, c.Admit(t.Context(), job), "a panic in AdmitFirst leaves the claim without an admission")
	b.cancel()
	b.requireRunWaits(t, "with a claim outstanding")
	c.Start(job)
	require.Equal(t, job.ID, p.next(t).ID)
	require.Nil(t, <-p.admissions)
	b.stop(t)
	require.Empty(t, b.tasksOfJob(t, job.ID))
}
