package maintenance_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/maintenance"
	"github.com/llmq/llmq/internal/redistest"
)

type testBundle struct {
	*jobstest.Bundle
	clock     *clocktest.Clock
	reg       *prometheus.Registry
	enqueuer  *dispatch.Enqueuer
	inspector *asynq.Inspector
	queue     string
}

// setup returns a job store, an asynq queue of the test's own, a registry holding the executor's
// and maintenance's metrics, and a Maintainer on them configured by cfg (its Store, Tasks,
// Finished, Metrics and Now are set here).
func setup(t *testing.T, cfg maintenance.Config) (*testBundle, *maintenance.Maintainer) {
	t.Helper()
	redistest.Client(t) // fails the test when Redis is down
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	client, insp := asynq.NewClient(opt), asynq.NewInspector(opt)
	b := &testBundle{Bundle: jobstest.New(t), clock: clocktest.New(time.Now()), reg: prometheus.NewRegistry(),
		inspector: insp, queue: redistest.Queue(t, redistest.URL())}
	t.Cleanup(func() {
		require.NoError(t, insp.Close())
		require.NoError(t, client.Close())
	})
	b.enqueuer = dispatch.NewEnqueuer(client, b.queue, nil)
	cfg.Store, cfg.Tasks, cfg.Now = b.Store, dispatch.NewTasks(insp, b.enqueuer), b.clock.Now
	cfg.Finished = executor.NewMetrics(b.reg).Finished
	cfg.Metrics = maintenance.NewMetrics(b.reg)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	return b, maintenance.New(cfg)
}

// taskState is the state of job id's asynq task (0: none).
func (b *testBundle) taskState(t *testing.T, id string) asynq.TaskState {
	t.Helper()
	info, err := b.inspector.GetTaskInfo(b.queue, id)
	if err != nil {
		require.ErrorIs(t, err, asynq.ErrTaskNotFound)
		return 0
	}
	return info.State
}

// status is job id's status.
func (b *testBundle) status(t *testing.T, id string) jobs.Status {
	t.Helper()
	job, err := b.Store.Get(t.Context(), id)
	require.NoError(t, err)
	return job.Status
}

func TestMaintainer_FailOverdue(t *testing.T) {
	t.Parallel()
	b, m := setup(t, maintenance.Config{DeadlineBatch: 2})
	ctx := t.Context()
	start := b.clock.Now()

	// Given jobs with a one-minute timeout that wait far past it: one holds a limiter slot an
	// hour out (its task scheduled then), one waits for its retry, one for a worker (a backlog).
	held := b.Create(t, jobstest.Opts{})
	_, err := b.Store.HoldSlot(ctx, held.ID, start.Add(time.Hour), 7, 0)
	require.NoError(t, err)
	require.NoError(t, b.enqueuer.Enqueue(ctx, held.ID, "", start.Add(time.Hour)))
	retrying := b.Create(t, jobstest.Opts{})
	b.Attempt(t, retrying.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	require.NoError(t, b.enqueuer.Enqueue(ctx, retrying.ID, "", start.Add(30*time.Minute)))
	backlog := b.Create(t, jobstest.Opts{})
	require.NoError(t, b.enqueuer.Enqueue(ctx, backlog.ID, "", time.Time{}))
	// And one whose call is in flight (its lease is live), and one with time left.
	inFlight := b.Create(t, jobstest.Opts{})
	_, err = b.Store.BeginAttempt(ctx, inFlight.ID)
	require.NoError(t, err)
	// The lease is checked on Postgres's real clock and lasts AttemptLease (15 s), which a loaded
	// run can spend before the last pass: it is made to outlive the test, as a call in flight
	// renews it.
	_, err = b.Pool.Exec(ctx, `UPDATE jobs SET lease_until = clock_timestamp() + interval '1 hour' WHERE id = $1`, inFlight.ID)
	require.NoError(t, err)
	later := b.Create(t, jobstest.Opts{Timeout: time.Hour})
	require.NoError(t, b.enqueuer.Enqueue(ctx, later.ID, "", time.Time{}))

	// The deadlines are on Postgres's clock, which the fake clock (made at the setup's start)
	// lags by as long as the setup took: the passes are dated from the rows' deadlines, the
	// first job's the earliest and the in-flight one's the latest of the four.
	// Before the deadline, nothing is failed.
	b.clock.Set(held.Deadline.Add(-time.Second))
	n, err := m.FailOverdue(ctx)
	require.NoError(t, err)
	require.Zero(t, n)

	// Just past it, the waiting jobs are failed in one pass (two statements of two), their
	// events written, their tasks gone, their ends counted.
	b.clock.Set(inFlight.Deadline.Add(time.Second))
	n, err = m.FailOverdue(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	for _, id := range []string{held.ID, retrying.ID, backlog.ID} {
		job, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusFailed, job.Status)
		require.Equal(t, jobs.ReasonDeadlineExceeded, job.LastError.Class)
		evs := b.Events(t, id)
		require.Equal(t, jobs.StatusFailed, evs[len(evs)-1])
		if id == held.ID {
			// Its row still holds a limiter slot: its task runs at once, to give it back.
			require.Equal(t, asynq.TaskStatePending, b.taskState(t, id))
			require.NotNil(t, job.SlotSeq)
			continue
		}
		require.Zero(t, b.taskState(t, id), "the task of %s is deleted", id)
	}
	require.Equal(t, jobs.StatusRunning, b.status(t, inFlight.ID))
	require.Equal(t, jobs.StatusQueued, b.status(t, later.ID))
	require.Equal(t, asynq.TaskStatePending, b.taskState(t, later.ID))
	failed := map[string]string{"credential": "default", "status": "failed"}
	require.InDelta(t, 3, metric(t, b.reg, "llmq_jobs_finished_total", failed), 0)
	require.InDelta(t, 3, metric(t, b.reg, "llmq_job_duration_seconds", failed), 0)

	n, err = m.FailOverdue(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
}

// metric is the value of the counter or gauge name with labels in reg, or the count of the
// histogram's observations (0: no such series).
func metric(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue series
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func TestMaintainer_DeleteExpired(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	b, m := setup(t, maintenance.Config{RetentionBatch: 2, BatchPause: time.Millisecond, Retention: map[jobs.Status]time.Duration{
		jobs.StatusSucceeded: 7 * day, jobs.StatusFailed: 7 * day, jobs.StatusCanceled: 7 * day, jobs.StatusDead: 30 * day,
	}})
	ctx := t.Context()
	finished := func(status jobs.Status, key string, ago time.Duration) string {
		id := b.Finished(t, status, key)
		b.FinishedAgo(t, id, ago)
		return id
	}
	// Given expired jobs of each status, three succeeded ones (more than a batch)...
	var expired []string
	for i, s := range []jobs.Status{jobs.StatusSucceeded, jobs.StatusSucceeded, jobs.StatusSucceeded, jobs.StatusFailed, jobs.StatusCanceled} {
		expired = append(expired, finished(s, "expired-"+string(rune('a'+i)), 8*day))
	}
	expired = append(expired, finished(jobs.StatusDead, "expired-dead", 31*day))
	// ... and jobs to keep: finished within their retention, or not finished however old.
	kept := []string{
		finished(jobs.StatusSucceeded, "recent", 6*day),
		finished(jobs.StatusDead, "dead-for-an-operator", 8*day),
		b.Create(t, jobstest.Opts{}).ID,
	}
	_, err := b.Pool.Exec(ctx, `UPDATE jobs SET created_at = now() - interval '60 days' WHERE id = $1`, kept[2])
	require.NoError(t, err)
	keptRows := map[string]map[string]int{}
	for _, id := range kept {
		keptRows[id] = b.Rows(t, id)
	}

	deleted, err := m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int64{jobs.StatusSucceeded: 3, jobs.StatusFailed: 1, jobs.StatusCanceled: 1, jobs.StatusDead: 1}, deleted)
	for _, id := range expired {
		require.Equal(t, map[string]int{"jobs": 0, "job_attempts": 0, "job_events": 0, "job_watches": 0, "idempotency_keys": 0},
			b.Rows(t, id), "job %s and all it had", id)
	}
	for id, rows := range keptRows {
		require.Equal(t, rows, b.Rows(t, id), "job %s is kept with all it has", id)
	}
	for status, want := range map[string]float64{"succeeded": 3, "failed": 1, "canceled": 1, "dead": 1} {
		require.InDelta(t, want, metric(t, b.reg, "llmq_retention_deleted_total", map[string]string{"status": status}), 0, status)
	}

	// A day later the next dead job's time has come; a pass with nothing to do deletes nothing.
	b.clock.Set(b.clock.Now().Add(23 * day))
	deleted, err = m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int64{jobs.StatusSucceeded: 1, jobs.StatusFailed: 0, jobs.StatusCanceled: 0, jobs.StatusDead: 1}, deleted)
}

func TestMaintainer_RetentionOff(t *testing.T) {
	t.Parallel()
	b, m := setup(t, maintenance.Config{Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: time.Hour}})
	succeeded := b.Finished(t, jobs.StatusSucceeded, "")
	failed := b.Finished(t, jobs.StatusFailed, "")
	for _, id := range []string{succeeded, failed} {
		b.FinishedAgo(t, id, 365*24*time.Hour)
	}

	// A status without a retention period is kept forever.
	deleted, err := m.DeleteExpired(t.Context())
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int64{jobs.StatusSucceeded: 1}, deleted)
	require.Equal(t, 1, b.Rows(t, failed)["jobs"])
}

func TestMaintainer_Run(t *testing.T) {
	t.Parallel()
	cfg := maintenance.Config{Interval: 20 * time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: time.Hour}}
	b, m := setup(t, cfg)
	overdue := b.Create(t, jobstest.Opts{})
	old := b.Finished(t, jobs.StatusSucceeded, "")
	b.FinishedAgo(t, old, 2*time.Hour)
	b.clock.Set(b.clock.Now().Add(2 * time.Minute))
	// A second process's Maintainer on the same database: only one leads at a time.
	cfg.Store, cfg.Now = b.Store, b.clock.Now
	second := maintenance.New(cfg)

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 2)
	go func() { done <- m.Run(ctx) }()
	go func() { done <- second.Run(ctx) }()
	require.Eventually(t, func() bool {
		return b.status(t, overdue.ID) == jobs.StatusFailed && b.Rows(t, old)["jobs"] == 0
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, []jobs.Status{"queued", "failed"}, b.Events(t, overdue.ID))
	cancel()
	for range 2 {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	}
}

// TestMaintainer_RunDatesItsLastSuccessfulPass: while a process leads, each pass that succeeds
// sets llmq_maintenance_last_success_timestamp_seconds to its start, which the
// LLMQMaintenanceStalled rule reads; a pass that fails leaves it where it was (its errors are
// logged once a run, so without it a deadline pass failing for hours showed one line). The
// deadline pass's series is there at 0 before any pass.
func TestMaintainer_RunDatesItsLastSuccessfulPass(t *testing.T) {
	t.Parallel()
	logs := &logtest.Buffer{}
	b, m := setup(t, maintenance.Config{Interval: 20 * time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: time.Hour}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	const name = "llmq_maintenance_last_success_timestamp_seconds"
	deadline, retention := map[string]string{"pass": "deadline"}, map[string]string{"pass": "retention"}
	n, err := testutil.GatherAndCount(b.reg, name)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the deadline pass's series, at 0 before any pass")
	unix := func(at time.Time) float64 { return float64(at.UnixNano()) / 1e9 }

	runLeading(t, m)
	t0 := b.clock.Now()
	require.Eventually(t, func() bool {
		return metric(t, b.reg, name, deadline) == unix(t0) && metric(t, b.reg, name, retention) == unix(t0)
	}, 30*time.Second, 10*time.Millisecond, "the passes that succeeded are dated")

	// The deadline pass fails from now on: its date stays.
	_, err = b.Pool.Exec(t.Context(), `ALTER TABLE jobs RENAME COLUMN deadline TO deadline_gone`)
	require.NoError(t, err)
	b.clock.Advance(time.Minute)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "deadline pass failed") },
		30*time.Second, 10*time.Millisecond)
	require.Equal(t, unix(t0), metric(t, b.reg, name, deadline), "a failed pass is not a success")

	// It succeeds again: dated again.
	_, err = b.Pool.Exec(t.Context(), `ALTER TABLE jobs RENAME COLUMN deadline_gone TO deadline`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return metric(t, b.reg, name, deadline) == unix(b.clock.Now()) },
		30*time.Second, 10*time.Millisecond)
}

// TestMaintainer_DeletesEndedBatches: the batch lane's provider batches go once they ended a day
// ago and no job is in them any more; a batch still holding a job, one that ended lately and one
// still open are kept.
func TestMaintainer_DeletesEndedBatches(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	b, m := setup(t, maintenance.Config{Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: 7 * day}})
	ctx := t.Context()
	batch := func(state string, endedAgo time.Duration) string {
		var id string
		require.NoError(t, b.Pool.QueryRow(ctx, `INSERT INTO provider_batches (id, credential, model, state, provider_batch_id, ended_at)
VALUES (gen_random_uuid(), 'default', 'm', $1, 'msgbatch_' || md5(random()::text), CASE WHEN $2::bigint > 0 THEN now() - make_interval(secs => $2::bigint) END)
RETURNING id::text`, state, int64(endedAgo/time.Second)).Scan(&id))
		return id
	}
	inBatch := func(jobID, batchID string) {
		_, err := b.Pool.Exec(ctx, `UPDATE jobs SET lane = 'batch', batch_ref = $2 WHERE id = $1`, jobID, batchID)
		require.NoError(t, err)
	}
	emptied := batch("ended", 8*day) // its job is deleted by this pass
	expired := b.Finished(t, jobs.StatusSucceeded, "")
	b.FinishedAgo(t, expired, 8*day)
	inBatch(expired, emptied)
	canceled := batch("canceled", 2*day)
	holding := batch("ended", 8*day) // its job is kept
	inBatch(b.Finished(t, jobs.StatusSucceeded, ""), holding)
	recent := batch("ended", time.Hour)
	open := batch("submitted", 0)

	_, err := m.DeleteExpired(ctx)
	require.NoError(t, err)
	var left []string
	rows, err := b.Pool.Query(ctx, `SELECT id::text FROM provider_batches`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.ElementsMatch(t, []string{holding, recent, open}, left, "gone: %s, %s", emptied, canceled)
}

// TestMaintainer_FailOverdueSkipsLockedRows: a job another transaction holds locked is skipped
// (not waited for), and the pass still fails every overdue job that is not locked, however many
// batches they take: a statement skips the locked row and takes the next ones up to its limit,
// so a short batch means no unlocked overdue job is left. The locked one is failed by the next
// pass once its lock is gone.
func TestMaintainer_FailOverdueSkipsLockedRows(t *testing.T) {
	t.Parallel()
	b, m := setup(t, maintenance.Config{DeadlineBatch: 2})
	ctx := t.Context()

	// Given five overdue jobs, the first (oldest deadline) locked by another transaction.
	var ids []string
	for range 5 {
		ids = append(ids, b.Create(t, jobstest.Opts{}).ID)
	}
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, ids[0])
	require.NoError(t, err)
	b.clock.Set(b.clock.Now().Add(2 * time.Minute))

	// One pass fails the four others, in batches of two: the lock makes no batch end early.
	n, err := m.FailOverdue(ctx)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.Equal(t, jobs.StatusQueued, b.status(t, ids[0]))
	for _, id := range ids[1:] {
		require.Equal(t, jobs.StatusFailed, b.status(t, id))
	}

	// Once the lock is gone, the next pass fails the last.
	require.NoError(t, tx.Rollback(ctx))
	n, err = m.FailOverdue(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, jobs.StatusFailed, b.status(t, ids[0]))
}

// TestMaintainer_DeletesExpiredAuditEntries: the retention pass deletes the audit log's entries
// older than AuditRetention, in batches, and keeps the others; it runs for the audit log even
// when no job status has a retention period.
func TestMaintainer_DeletesExpiredAuditEntries(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	b, m := setup(t, maintenance.Config{Interval: 20 * time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		RetentionBatch: 2, BatchPause: time.Millisecond, AuditRetention: 365 * day})
	ctx := t.Context()
	entry := func(action string, ago time.Duration) {
		e, err := audit.Log(ctx, b.Pool, audit.Entry{Operator: "ctl:root", Action: action})
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE audit_log SET at = at - make_interval(secs => $2::bigint) WHERE id = $1`,
			e.ID, int64(ago/time.Second))
		require.NoError(t, err)
	}
	actions := func() []string {
		entries, err := audit.List(ctx, b.Pool, audit.ListParams{Limit: 100})
		require.NoError(t, err)
		var out []string
		for _, e := range entries {
			out = append(out, e.Action)
		}
		return out
	}
	// Given five entries past the year (more than two batches) and two within it, written in
	// time order as entries are.
	for range 5 {
		entry("expired", 400*day)
	}
	entry("kept", 364*day)
	entry("recent", time.Minute)

	n, err := m.DeleteExpiredAudit(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), n)
	require.Equal(t, []string{"recent", "kept"}, actions())
	// Counted as the jobs are (the log line alone told of them).
	require.InDelta(t, 5, metric(t, b.reg, "llmq_retention_deleted_audit_entries_total", nil), 0)
	n, err = m.DeleteExpiredAudit(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing left to do")

	// Two days later the leader's retention pass deletes the next, though no job status has a
	// retention period.
	b.clock.Set(b.clock.Now().Add(2 * day))
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	require.Eventually(t, func() bool { // on testify's goroutine: no require here
		entries, err := audit.List(ctx, b.Pool, audit.ListParams{Limit: 100})
		return err == nil && len(entries) == 1 && entries[0].Action == "recent"
	}, 30*time.Second, 20*time.Millisecond)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// TestMaintainer_RetentionPassRunsWhenLeadingBegins: a process that takes the lead runs its first
// retention pass at once, not one retention.interval later. The lead moves at every restart,
// deploy or lost lock connection: with the first pass an interval after it (an hour, a day, as
// an operator may set), workers restarted more often than that never deleted anything.
func TestMaintainer_RetentionPassRunsWhenLeadingBegins(t *testing.T) {
	t.Parallel()
	b, m := setup(t, maintenance.Config{Interval: 20 * time.Millisecond, RetentionInterval: 24 * time.Hour,
		Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: time.Hour}})
	old := b.Finished(t, jobs.StatusSucceeded, "")
	b.FinishedAgo(t, old, 2*time.Hour)

	runLeading(t, m)
	require.Eventually(t, func() bool { // on testify's goroutine: no require here
		var n int
		err := b.Pool.QueryRow(t.Context(), `SELECT count(*) FROM jobs WHERE id = $1`, old).Scan(&n)
		return err == nil && n == 0
	}, 20*time.Second, 20*time.Millisecond, "the expired job is deleted by the first pass, long before the interval")
}

// pauses records the waits a retention pass asks for between its batches (Config.Sleep), and
// runs each's hook, without waiting.
type pauses struct {
	mu   sync.Mutex
	got  []time.Duration
	hook func()
}

func (p *pauses) sleep(ctx context.Context, d time.Duration) error {
	p.mu.Lock()
	p.got = append(p.got, d)
	hook := p.hook
	p.mu.Unlock()
	if hook != nil {
		hook()
	}
	return ctx.Err()
}

func (p *pauses) all() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

// TestMaintainer_PacesAndCountsEndedBatches: the ended provider batches are deleted like the
// jobs, RetentionBatch a statement with a pause between two (it had none: a backlog of them
// went in back-to-back statements), and counted in llmq_retention_deleted_provider_batches_total
// (they had no metric).
func TestMaintainer_PacesAndCountsEndedBatches(t *testing.T) {
	t.Parallel()
	p := &pauses{}
	b, m := setup(t, maintenance.Config{RetentionBatch: 2, BatchPause: time.Hour, Sleep: p.sleep,
		Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: 7 * 24 * time.Hour}})
	ctx := t.Context()
	// Given five provider batches that ended two days ago and hold no job (more than two
	// statements' worth).
	for range 5 {
		_, err := b.Pool.Exec(ctx, `INSERT INTO provider_batches (id, credential, model, state, provider_batch_id, ended_at)
VALUES (gen_random_uuid(), 'default', 'm', 'ended', 'msgbatch_' || md5(random()::text), now() - interval '2 days')`)
		require.NoError(t, err)
	}

	_, err := m.DeleteExpired(ctx)
	require.NoError(t, err)
	var left int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM provider_batches`).Scan(&left))
	require.Zero(t, left)
	// Three statements (2, 2, 1): a pause after each full one, none after the last.
	require.Equal(t, []time.Duration{time.Hour, time.Hour}, p.all(), "the pauses between statements")
	require.InDelta(t, 5, metric(t, b.reg, "llmq_retention_deleted_provider_batches_total", nil), 0)
}

// TestMaintainer_DeletesEndedBatchesHourly: the ended provider batches are looked for at most
// once an hour (the first pass looks at once), not every pass: each look reads every batch that
// ended a day ago and still holds a job (a succeeded job keeps its batch for its 7 days), 120,000
// buffers a look with 60,000 of them, every minute (docs/decisions.md).
func TestMaintainer_DeletesEndedBatchesHourly(t *testing.T) {
	t.Parallel()
	b, m := setup(t, maintenance.Config{Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: 7 * 24 * time.Hour}})
	ctx := t.Context()
	ended := func() string {
		var id string
		require.NoError(t, b.Pool.QueryRow(ctx, `INSERT INTO provider_batches (id, credential, model, state, provider_batch_id, ended_at)
VALUES (gen_random_uuid(), 'default', 'm', 'ended', 'msgbatch_' || md5(random()::text), now() - interval '2 days')
RETURNING id::text`).Scan(&id))
		return id
	}
	stored := func(id string) bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM provider_batches WHERE id = $1`, id).Scan(&n))
		return n == 1
	}
	// Given a batch that ended two days ago and holds no job, the first pass deletes it.
	first := ended()
	_, err := m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.False(t, stored(first), "the first pass looks for ended batches")

	// When another one is there a minute later, the next pass leaves it...
	second := ended()
	b.clock.Set(b.clock.Now().Add(time.Minute))
	_, err = m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.True(t, stored(second), "a pass within the hour does not look again")

	// ... and the first pass an hour after the last look deletes it.
	b.clock.Set(b.clock.Now().Add(time.Hour - time.Minute))
	_, err = m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.False(t, stored(second), "a pass an hour after the last look looks again")
	require.InDelta(t, 2, metric(t, b.reg, "llmq_retention_deleted_provider_batches_total", nil), 0)
}

// TestMaintainer_RetentionBacklog: llmq_retention_backlog_seconds{kind} is how long the oldest
// row the retention pass has yet to delete has been past its period, measured after each of its
// statements: an operator sees a pass that falls behind (rows due faster than it deletes them),
// which no metric showed. It is 0 once nothing is past its period, and the series of a kind
// appear only with a period.
func TestMaintainer_RetentionBacklog(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	p := &pauses{}
	b, m := setup(t, maintenance.Config{RetentionBatch: 2, Sleep: p.sleep, AuditRetention: 365 * day,
		Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: 7 * day}})
	ctx := t.Context()
	backlog := func(kind string) float64 {
		return metric(t, b.reg, "llmq_retention_backlog_seconds", map[string]string{"kind": kind})
	}
	// Given succeeded jobs that finished 10, 9 and 8 days ago (due 3, 2 and 1 days ago)...
	for _, ago := range []time.Duration{10 * day, 9 * day, 8 * day} {
		b.FinishedAgo(t, b.Finished(t, jobs.StatusSucceeded, ""), ago)
	}
	// ... and audit entries written 400 days ago (35 days past the year) and a minute ago.
	for _, ago := range []time.Duration{400 * day, 400 * day, 400 * day, time.Minute} {
		e, err := audit.Log(ctx, b.Pool, audit.Entry{Operator: "ctl:root", Action: "x"})
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE audit_log SET at = at - make_interval(secs => $2::bigint) WHERE id = $1`,
			e.ID, int64(ago/time.Second))
		require.NoError(t, err)
	}
	// The pass pauses after each full statement: there, what is left is measured.
	var seen []float64
	p.hook = func() { seen = append(seen, backlog("succeeded"), backlog("audit")) }

	_, err := m.DeleteExpired(ctx)
	require.NoError(t, err)
	_, err = m.DeleteExpiredAudit(ctx)
	require.NoError(t, err)
	// After the first two jobs, the third was due a day ago; the audit entries' pause comes after
	// the job's backlog was measured at 0, with one entry 35 days past its year left.
	require.Len(t, seen, 4)
	require.InDelta(t, day.Seconds(), seen[0], 120, "the job left after the first statement")
	require.InDelta(t, 0, seen[2], 0, "no job left")
	require.InDelta(t, (35 * day).Seconds(), seen[3], 120, "the audit entry left after the first statement")
	require.InDelta(t, 0, backlog("succeeded"), 0)
	require.InDelta(t, 0, backlog("audit"), 0)
	n, err := testutil.GatherAndCount(b.reg, "llmq_retention_backlog_seconds")
	require.NoError(t, err)
	require.Equal(t, 2, n, "a series for each kind with a period only")

	// A job the pass cannot take (locked: an operator retrying it) stays in the backlog, which
	// grows with the clock until it goes.
	old := b.Finished(t, jobs.StatusSucceeded, "")
	b.FinishedAgo(t, old, 8*day)
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, old)
	require.NoError(t, err)
	_, err = m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.InDelta(t, day.Seconds(), backlog("succeeded"), 120)
	b.clock.Advance(time.Hour)
	_, err = m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.InDelta(t, (day + time.Hour).Seconds(), backlog("succeeded"), 120)
	require.NoError(t, tx.Rollback(ctx))
	_, err = m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.InDelta(t, 0, backlog("succeeded"), 0)
}

// TestMaintainer_RetentionBacklogOnlyWhileLeading: the backlog is exported by the leading worker
// only; one that stops leading drops its series, so that a former leader's last value does not
// stand beside the new leader's (the alert reads the max over the workers).
func TestMaintainer_RetentionBacklogOnlyWhileLeading(t *testing.T) {
	t.Parallel()
	b, m := setup(t, maintenance.Config{Interval: 20 * time.Millisecond, RetentionInterval: time.Hour,
		Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: time.Hour}})
	count := func() int {
		n, err := testutil.GatherAndCount(b.reg, "llmq_retention_backlog_seconds")
		require.NoError(t, err)
		return n
	}
	stop := runLeading(t, m)
	require.Eventually(t, func() bool {
		return metric(t, b.reg, "llmq_maintenance_last_success_timestamp_seconds", map[string]string{"pass": "retention"}) > 0
	}, 30*time.Second, 10*time.Millisecond, "the first retention pass")
	// A lead lost and taken again in between (a lock connection timing out on a loaded
	// machine) drops the series until the new lead's first pass measures it again.
	require.Eventually(t, func() bool { return count() == 1 }, 30*time.Second, 10*time.Millisecond, "measured by the first pass")
	stop()
	require.Zero(t, count(), "dropped when the process stops leading")
}

// TestMaintainer_CountsFailedPassesInARow: a retention pass that fails every time left no trace
// but a log line once a run (its date is no stall sign: a pass draining a backlog runs for
// hours). The leader counts each pass's failures in a row, which LLMQRetentionFailing reads, back
// to 0 after one that succeeds, and drops the series when it stops leading.
func TestMaintainer_CountsFailedPassesInARow(t *testing.T) {
	t.Parallel()
	b, m := setup(t, maintenance.Config{Interval: 20 * time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		AuditRetention: time.Hour})
	const name = "llmq_maintenance_failed_passes_in_a_row"
	deadline, retention := map[string]string{"pass": "deadline"}, map[string]string{"pass": "retention"}
	count := func() int {
		n, err := testutil.GatherAndCount(b.reg, name)
		require.NoError(t, err)
		return n
	}
	stop := runLeading(t, m)
	require.Eventually(t, func() bool { return count() == 2 }, 30*time.Second, 10*time.Millisecond,
		"both passes succeeded once")
	require.Zero(t, metric(t, b.reg, name, retention))

	// The retention pass fails from now on (the audit log's statement); the deadline pass does not.
	_, err := b.Pool.Exec(t.Context(), `ALTER TABLE audit_log RENAME COLUMN at TO at_gone`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return metric(t, b.reg, name, retention) >= 3 }, 30*time.Second,
		10*time.Millisecond, "each failed retention pass counted")
	require.Zero(t, metric(t, b.reg, name, deadline), "the deadline pass kept succeeding")

	// It succeeds again: back to 0.
	_, err = b.Pool.Exec(t.Context(), `ALTER TABLE audit_log RENAME COLUMN at_gone TO at`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return metric(t, b.reg, name, retention) == 0 }, 30*time.Second,
		10*time.Millisecond, "a pass that succeeds ends the run")

	stop()
	require.Zero(t, count(), "dropped when the process stops leading")
}

// runLeading runs m until the returned stop is called, or the test ends: stop ends Run's context
// and fails the test unless Run returns nil within 10 s. Calling it again does nothing.
func runLeading(t *testing.T, m *maintenance.Maintainer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return after its context ended")
		}
	})
	t.Cleanup(stop)
	return stop
}
