package dispatch

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/internal/retrypolicy"
)

// ServerConfig configures the asynq server that delivers jobs to a worker process.
type ServerConfig struct {
	// Queue is the llmq queue the jobs are on: the server takes from both of its asynq queues
	// (see Queues).
	Queue string
	// Concurrency is how many deliveries run at once.
	Concurrency int
	// PollInterval is how often an idle server looks for a pending task (asynq's
	// TaskCheckInterval, default 1s there: ~0.5s p50 added to every job at moderate load).
	PollInterval time.Duration
	// Policy backs off deliveries that failed on the stores (see RetryDelayFunc).
	Policy *retrypolicy.Policy
	// Logger receives asynq's warnings and errors. Default discards.
	Logger *slog.Logger
}

// NewServer returns an asynq server that hands the tasks of cfg.Queue's asynq queues to p, a
// free delivery slot taking from the main queue and the low one 9:1 while both have tasks
// waiting (see Queues.weights): deferrals come back at their time without counting as failures,
// and retries and scheduled tasks are moved to pending every 50 ms (asynq's
// DelayedTaskCheckInterval, default 5s, bounds how precisely a limiter send time or a
// Retry-After is kept). Run it with Start(Mux(p, e)).
func NewServer(opt asynq.RedisConnOpt, cfg ServerConfig) *asynq.Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return asynq.NewServer(opt, asynq.Config{
		Concurrency:              cfg.Concurrency,
		Queues:                   NewQueues(cfg.Queue).weights(),
		TaskCheckInterval:        cfg.PollInterval,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		RetryDelayFunc:           RetryDelayFunc(cfg.Policy, time.Now),
		IsFailure:                IsFailure,
		ShutdownTimeout:          10 * time.Second,
		Logger:                   asynqLogger{cfg.Logger},
		LogLevel:                 asynq.WarnLevel,
	})
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
