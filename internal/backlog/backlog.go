// Package backlog measures, from Postgres (the source of truth), the online lane's jobs waiting
// for an attempt: how many wait, by status (queued, retrying), and how long the oldest of them
// has waited (since its submission, or its retry from dead). One process at a time measures (the
// worker leading maintenance runs Run while it leads), every Interval, with one statement that
// reads an index alone (jobs_online_waiting_idx) under a timeout, and dates each measurement
// that succeeded, so that a figure that stopped moving is seen as stale rather than read as
// current.
//
// Not asynq's Redis queues: a job waits in Postgres whether or not its task is in Redis (a lost
// enqueue, before the sweeper puts it back), and a deferred delivery's task is scheduled rather
// than pending.
package backlog

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logstreak"
)

// DefaultInterval is the time between two measurements: a Prometheus scrape interval.
const DefaultInterval = 15 * time.Second

// DefaultTimeout bounds one measurement's statement: a Postgres that does not answer leaves the
// last figures and their date where they were, and the next measurement tries again.
const DefaultTimeout = 10 * time.Second

// WaitingStatuses are the statuses of a job waiting for an attempt, the label values of
// llmq_jobs_waiting.
var WaitingStatuses = []jobs.Status{jobs.StatusQueued, jobs.StatusRetrying}

// Config configures a Gauge. Zero fields take the defaults documented on each.
type Config struct {
	// Pool is the jobs' database. Required.
	Pool *pgxpool.Pool
	// Interval is the time between two measurements of Run. Default DefaultInterval.
	Interval time.Duration
	// Timeout bounds each measurement. Default DefaultTimeout.
	Timeout time.Duration
	// Now is the clock the oldest job's age is measured with, against its submission or retry
	// (on Postgres's clock). Default time.Now.
	Now func() time.Time
	// Logger receives the first error of a run of failed measurements and the success that ends
	// it. Default discards.
	Logger *slog.Logger
	// Metrics receives the figures. Nil: none.
	Metrics *Metrics
}

// Figures are one measurement.
type Figures struct {
	// Waiting counts the online lane's jobs waiting for an attempt, by status (every status of
	// WaitingStatuses, 0 included).
	Waiting map[jobs.Status]int64
	// Oldest is since when the one that has waited longest has waited (its submission, or its
	// retry from dead); zero when none waits.
	Oldest time.Time
	// At is when they were measured, on Config.Now.
	At time.Time
}

// OldestAge is how long the oldest waiting job had waited at the measurement (since its
// submission, or its retry from dead); 0 when none waits (and never below 0, whatever the
// clocks' skew).
func (f Figures) OldestAge() time.Duration {
	if f.Oldest.IsZero() {
		return 0
	}
	return max(0, f.At.Sub(f.Oldest))
}

// Gauge measures the backlog. Safe for concurrent use.
type Gauge struct {
	cfg Config
}

// New returns a Gauge. It panics when Pool is nil (a wiring bug).
func New(cfg Config) *Gauge {
	if cfg.Pool == nil {
		panic("backlog.New: Pool is required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Gauge{cfg: cfg}
}

// waitingSQL counts the online lane's waiting jobs and finds since when the oldest has waited,
// by status, from jobs_online_waiting_idx alone (migration 023): its predicate is this
// statement's, and status, deadline and timeout_ms are its columns. A job waits since its
// submission or, a dead letter retried, since its retry: both set its deadline to its timeout
// from then (Postgres's clock_timestamp()), and nothing else moves it. created_at is the first
// submission's: a retry of dead letters that died days ago would show days of waiting, and page.
const waitingSQL = `SELECT status, count(*), min(deadline - timeout_ms * interval '1 millisecond') FROM jobs
WHERE status IN ('queued', 'retrying') AND lane = 'online' GROUP BY status`

// Measure reads the figures once, under Timeout, and sets the metrics to them and dates them.
// On an error the metrics keep their last figures and date.
func (g *Gauge) Measure(ctx context.Context) (Figures, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	f := Figures{Waiting: make(map[jobs.Status]int64, len(WaitingStatuses))}
	for _, s := range WaitingStatuses {
		f.Waiting[s] = 0
	}
	rows, err := g.cfg.Pool.Query(ctx, waitingSQL)
	if err != nil {
		return Figures{}, fmt.Errorf("measure the jobs waiting: %w", err)
	}
	var (
		status string
		n      int64
		oldest time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&status, &n, &oldest}, func() error {
		f.Waiting[jobs.Status(status)] = n
		if f.Oldest.IsZero() || oldest.Before(f.Oldest) {
			f.Oldest = oldest
		}
		return nil
	}); err != nil {
		return Figures{}, fmt.Errorf("measure the jobs waiting: %w", err)
	}
	f.At = g.cfg.Now()
	g.cfg.Metrics.set(f)
	return f, nil
}

// Run measures at once and then every Interval until ctx ends (the end of this process's lead),
// and then removes its figures (not their date): a process that no longer measures must not
// show its last figures beside the new leader's. A run of failed measurements is logged once.
func (g *Gauge) Run(ctx context.Context) {
	defer g.cfg.Metrics.stopped()
	report := logstreak.New(ctx, g.cfg.Logger, "backlog measurement")
	ticker := time.NewTicker(g.cfg.Interval)
	defer ticker.Stop()
	for {
		_, err := g.Measure(ctx)
		if ctx.Err() != nil {
			return
		}
		report(err)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
