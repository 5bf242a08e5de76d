package main

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/maintenance"
)

func retentionRunOf(on bool, rate, deleted float64) retentionRun {
	cpu := cpuSample{cpuWorkers: 2 * time.Second, cpuPostgres: time.Second, cpuRedis: time.Hour} // 0.3 ms per job
	if on {
		cpu[cpuPostgres] += time.Second // the deleter: 0.4 ms per job
	}
	return retentionRun{on: on, rate: rate, work: []time.Duration{ms(10), ms(20), ms(40)}, jobsDeleted: deleted,
		window: 10 * time.Second, rowsPerJob: 5.5, load: "7.00, 8.00, 9.00", cpu: cpu, jobs: 10_000}
}

func TestRetentionReport(t *testing.T) {
	t.Parallel()
	r, _ := parse[*retention](t, "retention")
	r.filled = fixtureRows{jobs: 1_000_000, attempts: 1_100_000, events: 3_220_000, keys: 300_000}
	r.runs = []retentionRun{retentionRunOf(false, 1000, 0), retentionRunOf(true, 930, 9000), retentionRunOf(true, 700, 8000),
		retentionRunOf(false, 1100, 0), retentionRunOf(false, 900, 0), retentionRunOf(true, 990, 10000)}

	on, ok := r.medianRun(true)
	require.True(t, ok)
	require.InDelta(t, 930, on.rate, 0, "the median of 930, 700 and 990")
	rep := r.report()
	rows := rep.tables[0].rows
	require.Len(t, rows, 2)
	require.Equal(t, []string{"off", "1,000,000", "10,000", "1000", "20.0 ms", "40.0 ms", "0", "0", "0", "0", "—", ""}, rows[0])
	require.Equal(t, []string{"on, every 1s, batches of 500", "1,000,000", "10,000", "930", "20.0 ms", "40.0 ms", "9000", "49500",
		"900", "4950", "0.93", "PASS"}, rows[1])
	notes := strings.Join(rep.notes, "\n")
	require.Contains(t, notes, "(1,100,000 attempts, 3,220,000 events, 300,000 idempotency keys: per job 1.10, 3.22 and 0.30;")
	require.Contains(t, notes, "Each run in order: off 1000 jobs/s (load 7.00, 8.00, 9.00); on 930 jobs/s, 9000 jobs deleted in 10.00 s "+
		"(load 7.00, 8.00, 9.00); on 700 jobs/s")
	require.Contains(t, notes, "Retention target: drain with the deleter ÷ without 0.93 (target ≥ 0.90): PASS.")
	require.Contains(t, notes, "With ÷ without, round by round: 0.93, 0.64, 1.10.", "each round's off run against its on run, in either order")
	require.Contains(t, notes, "median: 0.30 ms without the deleter, 0.40 ms with it; where the drain is bound by these CPUs the rates would stand at 0.75.",
		"Redis is shared: not counted")
	require.NotContains(t, notes, "not every job succeeded")

	r.runs[1].rate = 850 // the median with the deleter is now 850
	r.statuses = map[string]int{"succeeded": 119_999, "failed": 1}
	rep = r.report()
	require.Equal(t, []string{"0.85", "FAIL"}, rep.tables[0].rows[1][10:])
	notes = strings.Join(rep.notes, "\n")
	require.Contains(t, notes, "Retention target: drain with the deleter ÷ without 0.85 (target ≥ 0.90): FAIL (drain with the deleter ÷ without).")
	require.Contains(t, notes, "not every job succeeded: 1 failed")

	r.runs = r.runs[:1]
	require.Equal(t, "FAIL", verdict(r.checks()), "no run with the deleter, no pass")
	require.Len(t, r.report().tables[0].rows, 1)
}

func TestRetentionOrder(t *testing.T) {
	t.Parallel()
	var order []bool
	for k := range 3 {
		order = append(order, retentionOrder(k)...)
	}
	require.Equal(t, []bool{false, true, true, false, false, true}, order)
}

func TestRetentionRun_Rates(t *testing.T) {
	t.Parallel()
	run := retentionRun{jobsDeleted: 3000, rowsPerJob: 5.6, window: 2 * time.Second}
	require.InDelta(t, 16800, run.rowsDeleted(), 1e-9)
	require.InDelta(t, 1500, run.perSecond(run.jobsDeleted), 1e-9)
	require.Zero(t, retentionRun{jobsDeleted: 5}.perSecond(5), "no window, no rate")
	_, ok := run.cpuPerJob()
	require.False(t, ok, "not measured")
	run.cpu, run.jobs = cpuSample{cpuWorkers: time.Second}, 1000
	_, ok = run.cpuPerJob()
	require.False(t, ok, "the database's CPU not measured")
	run.cpu[cpuPostgres] = time.Second
	v, ok := run.cpuPerJob()
	require.True(t, ok)
	require.InDelta(t, 2.0, v, 1e-9)
}

func TestCounterSum(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	deleted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: deletedMetric}, []string{"status"})
	other := prometheus.NewCounter(prometheus.CounterOpts{Name: "llmq_other_total"})
	reg.MustRegister(deleted, other)
	deleted.WithLabelValues("succeeded").Add(1000)
	deleted.WithLabelValues("dead").Add(500)
	deleted.WithLabelValues("failed")
	other.Add(7)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.InDelta(t, 1500, counterSum(mfs, deletedMetric), 0)
	require.Zero(t, counterSum(nil, deletedMetric))
}

// The retention config a drain writes: off keeps every status; on takes the default periods
// and the short interval.
func TestRetentionSetupFor(t *testing.T) {
	t.Parallel()
	require.Equal(t, "retention: { succeeded: off, failed: off, canceled: off, dead: off }\n", retentionSetupFor(false).retention.yaml())
	require.Equal(t, "retention: { interval: 1s }\n", retentionSetupFor(true).retention.yaml())
	require.Empty(t, retentionSetup{}.yaml(), "nothing set: llmq's defaults")
}

// The fixture's statement fits the schema, inserts the mix its comment and the report's
// ratios state, only jobs past their retention (the real deleter takes every one of them and
// leaves the template), and its top-up restores the table with keys that do not collide.
func TestFixture(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	template := b.Finished(t, jobs.StatusSucceeded, "")
	fx := &fixture{pool: b.Pool, template: template, size: 1000}

	rows, err := fx.insert(ctx, 1000, nil)
	require.NoError(t, err)
	require.Equal(t, fixtureRows{jobs: 1000, attempts: 1100, events: 3220, keys: 300}, rows)
	require.InDelta(t, fixtureAttemptsPerJob, float64(rows.attempts)/1000, 1e-9)
	require.InDelta(t, fixtureEventsPerJob, float64(rows.events)/1000, 1e-9)
	require.InDelta(t, fixtureKeysPerJob, float64(rows.keys)/1000, 1e-9)
	statuses := map[string]int{}
	pgRows, err := b.Pool.Query(ctx, `SELECT status, count(*) FROM jobs WHERE id <> $1 GROUP BY status`, template)
	require.NoError(t, err)
	for pgRows.Next() {
		var s string
		var n int
		require.NoError(t, pgRows.Scan(&s, &n))
		statuses[s] = n
	}
	require.NoError(t, pgRows.Err())
	require.Equal(t, map[string]int{"succeeded": 930, "failed": 30, "dead": 20, "canceled": 20}, statuses)
	n, err := fx.count(ctx)
	require.NoError(t, err)
	require.Equal(t, 1000, n, "the template, created now, is not the fixture's")
	require.NoError(t, fx.vacuum(ctx))

	m := maintenance.New(maintenance.Config{Store: b.Store, BatchPause: time.Millisecond, Retention: map[jobs.Status]time.Duration{
		jobs.StatusSucceeded: 7 * 24 * time.Hour, jobs.StatusFailed: 7 * 24 * time.Hour, jobs.StatusCanceled: 7 * 24 * time.Hour,
		jobs.StatusDead: 30 * 24 * time.Hour}})
	deleted, err := m.DeleteExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, map[jobs.Status]int64{jobs.StatusSucceeded: 930, jobs.StatusFailed: 30, jobs.StatusCanceled: 20, jobs.StatusDead: 20}, deleted)
	for table, want := range map[string]int{"jobs": 1, "job_attempts": b.Rows(t, template)["job_attempts"],
		"job_events": b.Rows(t, template)["job_events"], "idempotency_keys": 0} {
		var got int
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table).Scan(&got))
		require.Equal(t, want, got, "%s: only the template's rows are left", table)
	}

	added, err := fx.topUp(ctx)
	require.NoError(t, err)
	require.Equal(t, 1000, added)
	added, err = fx.topUp(ctx)
	require.NoError(t, err)
	require.Zero(t, added, "the table is full")
}
