package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/gostack"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// ServerConfig configures the asynq server that delivers jobs to a worker process.
type ServerConfig struct {
	// Queue is the llmq queue the jobs are on: the server takes from both of its asynq queues
	// (see Queues).
	Queue string
	// Concurrency is how many deliveries run at once.
	Concurrency int
	// PollInterval is how often an idle server looks for a pending task it was not woken for
	// (see wake.go): one requeued by asynq's inspector, or enqueued by a process without a
	// wake-up client. Each wait lasts between half and one and a half of it, at most 2s.
	PollInterval time.Duration
	// Policy backs off deliveries that failed on the stores (see RetryDelayFunc).
	Policy *retrypolicy.Policy
	// Logger receives asynq's warnings and errors. Default discards.
	Logger *slog.Logger
	// Metrics, when set, counts the idle waits' ends (llmq_worker_idle_waits_total) and the
	// deliveries that failed (llmq_delivery_errors_total).
	Metrics *Metrics
	// ShutdownTimeout is how long Shutdown lets the deliveries running finish before it cuts
	// them (their tasks go back to the queue). Default DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
}

// DefaultShutdownTimeout is how long a stopping worker lets its deliveries finish
// (ServerConfig.ShutdownTimeout).
const DefaultShutdownTimeout = 10 * time.Second

// CutGrace bounds how long Shutdown waits, after its timeout cut the deliveries still running,
// for them to record what came of their attempts (an abandoned call's attempt, its stream's
// reset, its lease given back): a Postgres that does not answer must not hold a stopping
// worker for the executor's whole retry window.
const CutGrace = 5 * time.Second

// Server is the asynq server of a worker process, on a Redis client of its own whose idle
// polls wait for a wake-up (see wake.go).
type Server struct {
	srv   *asynq.Server
	rdb   redis.UniversalClient
	hook  *wakeHook
	log   *slog.Logger
	close sync.Once
	// stopping is set once Shutdown has begun; a delivery that ends then and leaves none
	// running says so on idle.
	stopping atomic.Bool
	idle     chan struct{}
}

// NewServer returns an asynq server that hands the tasks of cfg.Queue's asynq queues to p, a
// free delivery slot taking from the main queue and the low one 9:1 while both have tasks
// waiting (see Queues.weights): deferrals come back at their time without counting as failures,
// and retries and scheduled tasks are moved to pending every 50 ms (asynq's
// DelayedTaskCheckInterval, default 5s, bounds how precisely a limiter send time or a
// Retry-After is kept). An idle server is woken for a task enqueued by an Enqueuer with a wake-up
// client and for tasks its forwarder moved (see wake.go); a server with most of its slots free
// takes a main-queue backlog several tasks a round trip (see prefetch.go). Run it with
// Start(Mux(p, e)); Shutdown closes its connections.
func NewServer(opt asynq.RedisConnOpt, cfg ServerConfig) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	rdb := NewRedisClient(opt)
	hook := newWakeHook(rdb, cfg.Queue, cfg.PollInterval, cfg.Metrics, cfg.Logger)
	hook.concurrency = cfg.Concurrency
	rdb.AddHook(hook)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
		Concurrency:              cfg.Concurrency,
		Queues:                   NewQueues(cfg.Queue).weights(),
		TaskCheckInterval:        wokenSleep,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		RetryDelayFunc:           RetryDelayFunc(cfg.Policy, time.Now),
		IsFailure:                IsFailure,
		ErrorHandler:             deliveryErrors(cfg.Metrics),
		ShutdownTimeout:          cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout),
		Logger:                   asynqLogger{cfg.Logger},
		LogLevel:                 asynq.WarnLevel,
		BaseContext:              growBaseContext,
	})
	return &Server{srv: srv, rdb: rdb, hook: hook, log: cfg.Logger, idle: make(chan struct{}, 1)}
}

// growBaseContext is the server's asynq BaseContext: context.Background, after growing the
// stack of the goroutine that asks for it (see gostack). asynq asks for it first thing on the
// goroutine it starts for each task, which waits for the handler's goroutine and then settles
// the task in Redis (its Done, Retry or Requeue script): that goroutine otherwise grew its stack
// by doubling deep in go-redis, its first call, copying some twenty frames for every delivery
// (callgrind: 46,000 instructions a copy, a sixteenth of a worker's instructions per job).
func growBaseContext() context.Context {
	gostack.Grow()
	return context.Background()
}

// deliveryErrors is asynq's ErrorHandler: it counts the deliveries that failed, the processor's
// errors other than a deferral, and a lost task lease. A cancel (an abort of the job's task, a
// shutdown) is not a failure.
func deliveryErrors(m *Metrics) asynq.ErrorHandler {
	return asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
		if IsFailure(err) && !errors.Is(err, context.Canceled) {
			m.deliveryFailed()
		}
	})
}

// Start starts the server's processing of tasks with h (see asynq.Server.Start).
func (s *Server) Start(h asynq.Handler) error {
	busy := &s.hook.busy
	return s.srv.Start(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		busy.Add(1)
		defer func() {
			if busy.Add(-1) == 0 && s.stopping.Load() {
				select {
				case s.idle <- struct{}{}:
				default:
				}
			}
		}()
		return h.ProcessTask(ctx, t)
	}))
}

// Shutdown stops the server gracefully: it takes no more tasks and lets the deliveries running
// finish for up to ShutdownTimeout; then it cuts the rest (asynq puts their tasks back in the
// queue and cancels their contexts) and waits up to CutGrace for them to return, so that what
// they record of their attempts is written before the process goes on to close its stores.
// Then it gives back the tasks a batch dequeue took and asynq did not ask for (see
// prefetch.go), and closes its Redis client. Calling it again does nothing.
func (s *Server) Shutdown() {
	s.close.Do(func() {
		s.stopping.Store(true)
		s.srv.Shutdown()
		s.waitForCut()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.hook.giveBackKept(ctx); err != nil {
			// asynq's recoverer retries them when their lease ends.
			s.log.Warn("tasks taken ahead are left to asynq's recoverer", "err", err)
		}
		_ = s.rdb.Close()
	})
}

// waitForCut waits up to CutGrace for the deliveries still running once asynq's shutdown has
// returned: asynq stops waiting for a delivery its timeout cut as soon as it has put the task
// back, and the delivery, its context canceled, goes on recording the attempt it abandoned.
// Returning before it would let the process close the stores under it (the attempt unrecorded,
// its lease held until it runs out, its stream's reset unwritten, the limiter's and the
// breaker's bookkeeping lost).
func (s *Server) waitForCut() {
	n := s.hook.busy.Load()
	if n <= 0 {
		return
	}
	s.log.Info("waiting for the deliveries cut by the shutdown to record their attempts", "deliveries", n)
	t := time.NewTimer(CutGrace)
	defer t.Stop()
	for s.hook.busy.Load() > 0 {
		select {
		case <-s.idle:
		case <-t.C:
			s.log.Warn("deliveries cut by the shutdown did not return in time; their jobs wait for their leases",
				"deliveries", s.hook.busy.Load(), "waited", CutGrace.String())
			return
		}
	}
}

// Mux routes the job tasks to p. A delivery of a low job's task (on the low queue) that p defers
// comes back on the main queue (Queues.Due) of e's llmq queue, under the TaskID job ID + ":due":
// asynq would put the task back at the tail of the low queue when its time came, behind every
// low task waiting there, and the limiter's turn it was deferred to would pass while the workers
// went through a batch backlog (2 of 10 requests a second used during a first pass over 100,000
// low jobs). The main queue holds interactive work and the deferred deliveries whose time has
// come; a deferral of any other task (the main queue's, or a due task's) is asynq's retry on its
// own queue. A job has at most one due task: when one exists, a deferral of the job's low task
// (a sweep's or a rescue's duplicate) just ends that task.
func Mux(p Processor, e *Enqueuer) *asynq.ServeMux {
	mux := asynq.NewServeMux()
	mux.Handle(TaskType, handler{p: p, due: e})
	return mux
}

// asynqLogger routes asynq's printf-style logs into slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
