// Package maintenance runs the workers' leader-only passes over the job table, in one process at a
// time (elected with a Postgres advisory lock, see internal/leader):
//
//   - the deadline pass, every second, fails the jobs whose deadline passed while they waited for
//     an attempt (a held limiter slot, a breaker cooldown, a paused credential, a retry delay, a
//     backlog), so that a job is answered at its deadline rather than when it is next picked up,
//     and stops their asynq tasks (a job that held a limiter slot has its task run at once
//     instead, whose delivery gives the slot back: see executor);
//   - the retention pass, as the process begins to lead and then every minute by default
//     (retention.interval), deletes the finished jobs older than their status's retention, with
//     their attempts, events and idempotency keys, in short batches, the batch lane's ended
//     provider batches that hold no job any more (looked for at most hourly), then the audit
//     log's entries older than its retention, and the tenants' rotated-out tokens whose overlap
//     ended as long ago (their rotations' entries gone with them); after each batch it measures
//     its backlog (how long the oldest row left has been past its period), which shows a pass
//     that deletes slower than rows expire. Each of those kinds is deleted whatever the others'
//     errors: one that keeps failing holds up no other.
//
// Both are statements of internal/jobs (FailOverdue, DeleteFinished), internal/audit
// (DeleteBefore) and internal/tenant (DeleteRotatedOut), conditional and batched like every
// other write there; this package decides when they run and reports what they did.
// It knows nothing of asynq: the tasks are stopped through a TaskAborter (dispatch.Tasks).
package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/leader"
	"github.com/llmq/llmq/internal/logstreak"
	"github.com/llmq/llmq/internal/tenant"
)

// lockKey elects the one maintaining process ("llmqmain"). Not the sweeper's: the two duties
// may lead in different processes, and a long retention pass never delays a sweep.
const lockKey int64 = 0x6c6c6d716d61696e

// retentionShareDiv paces the retention pass: it deletes for at most 1/retentionShareDiv of the
// time. At a half (a pause as long as the batch) the drain of a backlog beside it ran at 0.80 ×
// its rate without it on two cores (docs/benchmarks.md, retention): the deleter took its share of
// the CPU the jobs needed.
const retentionShareDiv = 10

// statementTimeout bounds each statement of a pass.
const statementTimeout = 30 * time.Second

// TaskAborter stops a job's asynq task: dispatch.Tasks. Safe for concurrent use.
type TaskAborter interface {
	// Abort stops the task of a job that ended.
	Abort(id string) error
	// AbortHeld stops the task of a job that ended with a limiter slot held in its row, but
	// runs a waiting one at once, whose delivery gives the slot back.
	AbortHeld(id string) error
}

// Config configures a Maintainer. Zero fields take the defaults documented on each.
type Config struct {
	// Store is the job store. Required.
	Store *jobs.Store
	// Tasks stops the tasks of the jobs the deadline pass failed. Nil: they are left in asynq,
	// and each finds its job finished when it is delivered.
	Tasks TaskAborter
	// Retention is how long the jobs of each final status are kept after they finished; a status
	// that is absent, or 0, is kept forever.
	Retention map[jobs.Status]time.Duration
	// AuditRetention is how long the audit log's entries are kept (internal/audit), and the
	// tenants' rotated-out tokens after their overlap ended (DeleteRotatedOutTokens); 0 keeps
	// them forever.
	AuditRetention time.Duration
	// Interval is the time between deadline passes and between tries to lead: how late after its
	// deadline a waiting job is failed, at most (plus a pass's own time). Default 1s.
	Interval time.Duration
	// RetentionInterval is the time between retention passes; the first comes as soon as this
	// process begins to lead. Default 1m.
	RetentionInterval time.Duration
	// DeadlineBatch is how many jobs one statement of the deadline pass fails. Default 100.
	DeadlineBatch int
	// RetentionBatch is how many jobs (or audit entries) one statement (one short transaction) of
	// the retention pass deletes. Default 500.
	RetentionBatch int
	// BatchPause is the least wait between two batches of a retention pass; the wait is
	// retentionShareDiv-1 times as long as the batch took when that is longer, so that deleting a
	// large backlog takes at most a tenth of one Postgres connection's time, and less when a busy
	// Postgres slows the batches down. Default 100ms.
	BatchPause time.Duration
	// Finished, when set, is told of each job the deadline pass failed, as the executor tells
	// its metrics of the jobs it ends (executor.Metrics.Finished).
	Finished func(credential string, status jobs.Status, deadReason string, sinceSubmit time.Duration)
	// Logger receives one line per job the deadline pass fails, one per retention pass, and
	// errors. Default discards.
	Logger *slog.Logger
	// Metrics counts deleted jobs and provider batches, measures the retention backlog and
	// dates the last successful pass of each kind. Nil: none.
	Metrics *Metrics
	// LeaderGauge is 1 while this process leads maintenance, 0 otherwise (llmq_leader; see
	// leader.Metrics.Duty). Nil: none.
	LeaderGauge prometheus.Gauge
	// Now is the clock the deadlines and retention periods are measured with. Default time.Now.
	Now func() time.Time
	// Leading are further duties of the maintaining process (backlog.Gauge.Run): each runs in a
	// goroutine of its own while this process leads, from the start of the lead until it ends
	// (its context ends then), and must return then.
	Leading []func(ctx context.Context)
	// Sleep waits d (a retention pass's pause between two batches) or until ctx ends, and
	// returns ctx's error if it ended. Default a timer.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Maintainer runs the deadline and retention passes while its process leads. Safe for
// concurrent use.
type Maintainer struct {
	cfg Config

	mu sync.Mutex
	// batchesLookedAt is when the last look for ended provider batches that succeeded began, on
	// Config.Now; zero before the first (see endedBatchEvery).
	batchesLookedAt time.Time
}

// New returns a Maintainer. It panics when Store is nil (a wiring bug).
func New(cfg Config) *Maintainer {
	if cfg.Store == nil {
		panic("maintenance.New: Store is required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.RetentionInterval <= 0 {
		cfg.RetentionInterval = time.Minute
	}
	if cfg.DeadlineBatch <= 0 {
		cfg.DeadlineBatch = 100
	}
	if cfg.RetentionBatch <= 0 {
		cfg.RetentionBatch = 500
	}
	if cfg.BatchPause <= 0 {
		cfg.BatchPause = 100 * time.Millisecond
	}
	if cfg.Finished == nil {
		cfg.Finished = func(string, jobs.Status, string, time.Duration) {}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = sleep
	}
	return &Maintainer{cfg: cfg}
}

// Run tries to lead every Interval and, while this process leads, runs the deadline pass every
// Interval and the retention pass every RetentionInterval, each at once when it begins to lead.
// It returns when ctx ends. Errors are logged, the first of a run of them only: during a
// Postgres outage every process would otherwise log one a second.
func (m *Maintainer) Run(ctx context.Context) error {
	leader.Run(ctx, m.cfg.Store.Pool(), lockKey, m.cfg.Interval, m.cfg.LeaderGauge, m.lead,
		logstreak.New(ctx, m.cfg.Logger, "maintenance leadership"))
	return nil
}

// lead runs both passes until ctx ends (shutdown, or the leader lock's connection failed).
func (m *Maintainer) lead(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() {
		m.every(ctx, m.cfg.Interval, true, "deadline pass", func(ctx context.Context) error {
			start := m.cfg.Now()
			_, err := m.FailOverdue(ctx)
			switch {
			case err == nil:
				m.cfg.Metrics.passed(passDeadline, start)
			case ctx.Err() == nil: // not cut by the end of the lead
				m.cfg.Metrics.failed(passDeadline)
			}
			return err
		})
	})
	if m.retains() {
		wg.Go(func() {
			// At once too: the lead moves at every restart, deploy or lost lock connection, and
			// with the first pass an interval after it, workers restarted more often than the
			// interval never deleted anything. A pass with nothing to delete is a few index probes.
			m.every(ctx, m.cfg.RetentionInterval, true, "retention pass", func(ctx context.Context) error {
				m.retentionPass(ctx) // logs its own line, error included
				return nil
			})
		})
	}
	for _, duty := range m.cfg.Leading {
		wg.Go(func() { duty(ctx) })
	}
	wg.Wait()
	// A process that no longer leads measures no backlog and counts no failures: its last
	// values would stand beside the new leader's.
	m.cfg.Metrics.stoppedLeading()
	return nil
}

// every runs pass every interval (at once too when now is set) until ctx ends.
func (m *Maintainer) every(ctx context.Context, interval time.Duration, now bool, name string, pass func(context.Context) error) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	report := logstreak.New(ctx, m.cfg.Logger, name)
	for {
		if now {
			report(pass(ctx))
		}
		now = true
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// FailOverdue fails every job whose deadline has passed while it waited for an attempt (see
// jobs.Store.FailOverdue), DeadlineBatch at a time, and stops its task. It returns how many it
// failed. Each is counted as the executor counts the jobs it ends (Config.Finished) and logged
// as the executor logs them ("job failed", class deadline_exceeded).
func (m *Maintainer) FailOverdue(ctx context.Context) (int, error) {
	total := 0
	for {
		sctx, cancel := context.WithTimeout(ctx, statementTimeout)
		failed, err := m.cfg.Store.FailOverdue(sctx, m.cfg.Now(), m.cfg.DeadlineBatch)
		cancel()
		if err != nil {
			return total, err
		}
		total += len(failed)
		for _, o := range failed {
			m.cfg.Finished(o.Credential, jobs.StatusFailed, "", o.FinishedAt.Sub(o.CreatedAt))
			m.cfg.Logger.WarnContext(ctx, "job failed", "job_id", o.ID, "credential", o.Credential,
				"status", jobs.StatusFailed, "class", jobs.ReasonDeadlineExceeded, "waited_as", o.From)
			m.abort(ctx, o)
		}
		// A short batch means no overdue job is left that is not locked: SKIP LOCKED passes over
		// a locked row before the LIMIT counts (Postgres locks below the Limit node), so a
		// statement skipping some still fills its batch when others remain. The locked ones (a
		// delivery's short transaction) are taken by the next pass; going on now would spin.
		if len(failed) < m.cfg.DeadlineBatch {
			return total, nil
		}
	}
}

// abort stops the task of a job the deadline pass failed. Postgres has the outcome already: a
// task left behind finds its job finished when it is delivered, so a failure is only logged. A
// job that held a limiter slot has its waiting task run at once instead, whose delivery gives
// the slot back (TaskAborter.AbortHeld).
func (m *Maintainer) abort(ctx context.Context, o jobs.Overdue) {
	if m.cfg.Tasks == nil {
		return
	}
	abort := m.cfg.Tasks.Abort
	if o.HeldSlot {
		abort = m.cfg.Tasks.AbortHeld
	}
	if err := abort(o.ID); err != nil {
		m.cfg.Logger.WarnContext(ctx, "stop the task of a job past its deadline", "job_id", o.ID, "error", err)
	}
}

// finalStatuses are the statuses the retention pass deletes, in its order.
var finalStatuses = []jobs.Status{jobs.StatusSucceeded, jobs.StatusFailed, jobs.StatusCanceled, jobs.StatusDead}

// retains reports whether any final status, or the audit log, has a retention period.
func (m *Maintainer) retains() bool {
	if m.cfg.AuditRetention > 0 {
		return true
	}
	for _, s := range finalStatuses {
		if m.cfg.Retention[s] > 0 {
			return true
		}
	}
	return false
}

// endedBatchKeep is how long the row of a provider batch that ended and holds no job any more is
// kept: long past the lost-send look-up that reads recent batches (batchlane's findWindow).
const endedBatchKeep = 24 * time.Hour

// endedBatchEvery is the least time between two looks for ended provider batches to delete. A
// look reads every batch that ended before endedBatchKeep and still holds a job (a succeeded or
// failed job keeps its batch for its status's period: 7 days by default), each one a probe of
// jobs_batch_ref_idx: 120,000 buffers and 0.3 to 0.5 s with 60,000 of them, which every pass
// (every minute) paid to delete nothing. Hourly, a batch stays at most an hour past its day.
const endedBatchEvery = time.Hour

// DeleteExpired deletes, for each final status with a retention period, the jobs that finished
// longer ago than it (see jobs.Store.DeleteFinished), RetentionBatch per transaction with a pause
// between (see Config.BatchPause), and returns how many of each status it deleted. After each
// batch it measures what is left past its period (llmq_retention_backlog_seconds). Then the batch
// lane's provider batches that ended a day ago and hold no job any more go
// (jobs.Store.DeleteEndedBatches), in batches paced the same way: a row per batch, kept forever
// before. Those are looked for on the first call and then at most every endedBatchEvery on the
// clock Now, until a look succeeds.
//
// Each kind (a status, the provider batches) is deleted on its own: one that fails (a statement
// timeout on its backlog, a lock) stops only itself, and the others are still deleted. The error
// joins those of the kinds that failed, each naming its kind; the counts are what each deleted
// until then. Only the end of ctx stops the kinds left.
func (m *Maintainer) DeleteExpired(ctx context.Context) (map[jobs.Status]int64, error) {
	now := m.cfg.Now()
	deleted := map[jobs.Status]int64{}
	var errs []error
	for _, s := range finalStatuses {
		keep := m.cfg.Retention[s]
		if keep <= 0 {
			continue
		}
		if err := m.deleteBefore(ctx, s, now, keep, deleted); err != nil {
			errs = append(errs, fmt.Errorf("delete expired %s jobs: %w", s, err))
			if ctx.Err() != nil {
				return deleted, errors.Join(errs...)
			}
		}
	}
	if err := m.deleteEndedBatches(ctx, now); err != nil {
		errs = append(errs, fmt.Errorf("delete ended provider batches: %w", err))
	}
	return deleted, errors.Join(errs...)
}

// deleteEndedBatches deletes the provider batches that ended endedBatchKeep before now and hold no
// job, unless the last look that succeeded began less than endedBatchEvery before now.
func (m *Maintainer) deleteEndedBatches(ctx context.Context, now time.Time) error {
	m.mu.Lock()
	last := m.batchesLookedAt
	m.mu.Unlock()
	if !last.IsZero() && now.Sub(last) < endedBatchEvery {
		return nil
	}
	err := m.inBatches(ctx, func(ctx context.Context) (int64, error) {
		n, err := m.cfg.Store.DeleteEndedBatches(ctx, now.Add(-endedBatchKeep), m.cfg.RetentionBatch)
		m.cfg.Metrics.deletedProviderBatches(n)
		return n, err
	})
	if err == nil {
		m.mu.Lock()
		m.batchesLookedAt = now
		m.mu.Unlock()
	}
	return err
}

// deleteBefore deletes status's jobs that finished more than keep before now, batch by batch,
// adding their count to deleted, and measures the backlog after each batch.
func (m *Maintainer) deleteBefore(ctx context.Context, status jobs.Status, now time.Time, keep time.Duration, deleted map[jobs.Status]int64) error {
	return m.inBatches(ctx, func(ctx context.Context) (int64, error) {
		n, err := m.cfg.Store.DeleteFinished(ctx, status, now.Add(-keep), m.cfg.RetentionBatch)
		deleted[status] += n
		m.cfg.Metrics.deleted(status, n)
		if err != nil {
			return n, err
		}
		return n, m.measure(ctx, string(status), keep, func(ctx context.Context) (time.Time, bool, error) {
			return m.cfg.Store.OldestFinished(ctx, status)
		})
	})
}

// measure sets kind's backlog (llmq_retention_backlog_seconds): how long the oldest row still
// stored, which oldest reads, has been past its period keep on the clock Now; 0 when none is.
func (m *Maintainer) measure(ctx context.Context, kind string, keep time.Duration,
	oldest func(context.Context) (time.Time, bool, error)) error {
	at, ok, err := oldest(ctx)
	if err != nil {
		return err
	}
	var late time.Duration
	if ok {
		late = max(0, m.cfg.Now().Sub(at.Add(keep)))
	}
	m.cfg.Metrics.backlogIs(kind, late)
	return nil
}

// DeleteExpiredAudit deletes the audit log's entries older than AuditRetention (see
// audit.DeleteBefore), RetentionBatch per statement with a pause between as for the jobs,
// measuring the backlog after each as for them (kind audit) and counting them
// (llmq_retention_deleted_audit_entries_total), and returns how many it deleted
// (until an error, which it returns too). With no AuditRetention it deletes nothing.
func (m *Maintainer) DeleteExpiredAudit(ctx context.Context) (int64, error) {
	if m.cfg.AuditRetention <= 0 {
		return 0, nil
	}
	before := m.cfg.Now().Add(-m.cfg.AuditRetention)
	var total int64
	err := m.inBatches(ctx, func(ctx context.Context) (int64, error) {
		n, err := audit.DeleteBefore(ctx, m.cfg.Store.Pool(), before, m.cfg.RetentionBatch)
		total += n
		m.cfg.Metrics.deletedAuditEntries(n)
		if err != nil {
			return n, err
		}
		return n, m.measure(ctx, kindAudit, m.cfg.AuditRetention, func(ctx context.Context) (time.Time, bool, error) {
			return audit.Oldest(ctx, m.cfg.Store.Pool())
		})
	})
	return total, err
}

// DeleteRotatedOutTokens deletes the tenants' tokens replaced by a rotation whose overlap ended
// longer ago than AuditRetention (see tenant.Store.DeleteRotatedOut), RetentionBatch per
// statement with a pause between as for the jobs, counting them
// (llmq_retention_deleted_previous_tokens_total), and returns how many it deleted (until an
// error, which it returns too). They go with the audit log's entries of their rotations
// (docs/decisions.md): with no AuditRetention it deletes nothing.
func (m *Maintainer) DeleteRotatedOutTokens(ctx context.Context) (int64, error) {
	if m.cfg.AuditRetention <= 0 {
		return 0, nil
	}
	before := m.cfg.Now().Add(-m.cfg.AuditRetention)
	tenants := tenant.NewStore(m.cfg.Store.Pool(), nil)
	var total int64
	err := m.inBatches(ctx, func(ctx context.Context) (int64, error) {
		n, err := tenants.DeleteRotatedOut(ctx, before, m.cfg.RetentionBatch)
		total += n
		m.cfg.Metrics.deletedPreviousTokens(n)
		return n, err
	})
	return total, err
}

// inBatches runs del, which deletes up to RetentionBatch rows, each under statementTimeout,
// until it deletes fewer, waiting between two as Config.BatchPause says.
func (m *Maintainer) inBatches(ctx context.Context, del func(context.Context) (int64, error)) error {
	for {
		start := time.Now()
		sctx, cancel := context.WithTimeout(ctx, statementTimeout)
		n, err := del(sctx)
		cancel()
		if err != nil {
			return err
		}
		if n < int64(m.cfg.RetentionBatch) {
			return nil
		}
		if err := m.cfg.Sleep(ctx, max(m.cfg.BatchPause, (retentionShareDiv-1)*time.Since(start))); err != nil {
			return err
		}
	}
}

// retentionPass runs DeleteExpired, DeleteExpiredAudit and DeleteRotatedOutTokens, each whatever
// the others' errors (a kind that keeps failing must not keep the others from being deleted,
// docs/decisions.md), and logs one line: what they deleted, and the errors if any, each naming
// its kind. A pass with any kind failed counts as failed (llmq_maintenance_failed_passes_in_a_row).
func (m *Maintainer) retentionPass(ctx context.Context) {
	start, began := time.Now(), m.cfg.Now()
	deleted, jobsErr := m.DeleteExpired(ctx)
	auditDeleted, auditErr := m.DeleteExpiredAudit(ctx)
	if auditErr != nil {
		auditErr = fmt.Errorf("delete expired audit entries: %w", auditErr)
	}
	tokensDeleted, tokensErr := m.DeleteRotatedOutTokens(ctx)
	if tokensErr != nil {
		tokensErr = fmt.Errorf("delete rotated-out tokens: %w", tokensErr)
	}
	err := errors.Join(jobsErr, auditErr, tokensErr)
	switch {
	case err == nil:
		m.cfg.Metrics.passed(passRetention, began)
	case ctx.Err() == nil: // not cut by the end of the lead
		m.cfg.Metrics.failed(passRetention)
	}
	total := auditDeleted + tokensDeleted
	attrs := []any{"duration", time.Since(start).Round(time.Millisecond)}
	for _, s := range finalStatuses {
		total += deleted[s]
		attrs = append(attrs, string(s), deleted[s])
	}
	attrs = append(attrs, "audit_entries", auditDeleted, "previous_tokens", tokensDeleted)
	level := slog.LevelDebug
	if total > 0 {
		level = slog.LevelInfo
	}
	if err != nil && ctx.Err() == nil { // not a shutdown
		level, attrs = slog.LevelWarn, append(attrs, "error", err)
	}
	m.cfg.Logger.Log(ctx, level, "retention pass deleted finished jobs", attrs...)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
