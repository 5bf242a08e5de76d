package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
)

// retention is `bench retention`: a table of finished jobs all past their retention (see
// retentionfill.go), and a backlog of n queued jobs drained with the retention pass deleting
// them all along, and drained with it off; runs interleaved. The retention target: the drain
// rate with the deleter at least 0.9 × the rate without it.
//
// Each drain: the workers stopped, the table topped up to -finished expired jobs and vacuumed,
// n jobs queued, the queue paused, the workers started with retention on (retention.interval
// 1s, so that the pass begins at once) or off; with it on, the queue waits until the deleter
// has deleted its first batch; then the queue resumes and the drain is timed, first result to
// last, from the jobs' finished_at.
type retention struct {
	o        tpOpts
	finished int            // -finished: expired finished jobs in the table when each drain starts
	fillTime time.Duration  // inserting the table
	filled   fixtureRows    // what the first fill inserted
	runs     []retentionRun // in the order run
	statuses map[string]int // of every drained job
}

// retentionRun is one measured drain.
type retentionRun struct {
	on   bool
	rate float64 // drain jobs/s: first result to last
	// work is each job's first attempt start → result: the delivery's own time, which the
	// deleter's statements could slow down without the rate showing it. Submit → result is the
	// wait in the backlog.
	work []time.Duration
	// jobsDeleted is how many jobs the retention pass deleted while the queue drained (the
	// workers' llmq_retention_deleted_total, read when the queue resumed and when the last job
	// had completed), window the time between those readings.
	jobsDeleted float64
	window      time.Duration
	// rowsPerJob is the rows deleted per job deleted (with its attempts, events, watch and key)
	// over the whole time the workers ran, from Postgres's statistics once they had stopped.
	rowsPerJob float64
	// cpu is the CPU the workers and the run database's backends (the deleter's included) spent
	// between the queue's resume and the last result: what the deleter costs in CPU, which the
	// machine's other load does not blur as it blurs the rates.
	cpu  cpuSample
	jobs int    // jobs drained
	load string // the load average (1, 5, 15 minutes) when the drain ended
}

// cpuPerJob is the workers' and the database's CPU ms per drained job; ok is false when either
// was not measured.
func (r retentionRun) cpuPerJob() (float64, bool) {
	w, okW := r.cpu[cpuWorkers]
	pg, okPG := r.cpu[cpuPostgres]
	if !okW || !okPG || r.jobs == 0 {
		return 0, false
	}
	return float64(w+pg) / float64(time.Millisecond) / float64(r.jobs), true
}

// rowsDeleted estimates the rows the pass deleted during the drain.
func (r retentionRun) rowsDeleted() float64 { return r.jobsDeleted * r.rowsPerJob }

// perSecond is v over the run's window (0 without one).
func (r retentionRun) perSecond(v float64) float64 {
	if r.window <= 0 {
		return 0
	}
	return v / r.window.Seconds()
}

const (
	// retentionInterval is retention.interval in the drains with the deleter: its first pass
	// begins a second after a worker takes the maintenance lock, and then runs until the table
	// is empty (far longer than a drain).
	retentionInterval = time.Second
	// retentionSettle is how long the workers idle, the queue paused, before a drain; the
	// deleter's first batch may take longer.
	retentionSettle = 2 * time.Second
	// retentionStartWithin bounds the wait for the deleter's first batch.
	retentionStartWithin = time.Minute
	// retentionTarget: the drain with the deleter within 10 % of the drain without it.
	retentionTarget = 0.10
	// deletedMetric counts the jobs the retention pass deleted (internal/maintenance).
	deletedMetric = "llmq_retention_deleted_total"
)

func (r *retention) flags(fs *flagSet, s *shared) {
	r.o.flags(fs, s, false)
	s.jobs(fs, 10_000, "jobs in each drained backlog")
	s.repeat(fs, 3)
	s.deadline(fs, 10*time.Minute, "cap on the warm-up and on each drain")
	fs.intAtLeast(&r.finished, "finished", 1_000_000, 1, "finished jobs past their retention in the table when each drain starts")
	fs.check(func() error {
		switch {
		case s.n < 2:
			return errors.New("-n: at least 2 jobs (a rate runs from the first result to the last)")
		case r.o.warmup < 1:
			return errors.New("-warmup: at least 1 job (the finished jobs copy a warm-up job's request and answer)")
		}
		return nil
	})
}

// retentionOrder is whether each drain of round k runs with the deleter: off then on, then on
// then off, and so on, so that neither side always comes first.
func retentionOrder(k int) []bool {
	if k%2 == 0 {
		return []bool{false, true}
	}
	return []bool{true, false}
}

// retentionSetupFor is the config of a drain with the deleter on or off.
func retentionSetupFor(on bool) llmqSetup {
	if on {
		return llmqSetup{retention: &retentionSetup{interval: retentionInterval}}
	}
	return llmqSetup{retention: &retentionSetup{off: true}}
}

func (r *retention) run(ctx context.Context, log logf) error {
	if err := r.o.binaries(ctx, log); err != nil {
		return err
	}
	o := r.o
	sys := &llmqSystem{o: o, log: log, setup: retentionSetupFor(false)}
	defer sys.close()
	if err := sys.prepare(ctx, o.warmup+2*o.runs*o.n); err != nil {
		return err
	}
	if _, err := closedLoop(min(o.clients, o.warmup))(ctx, sys, 0, o.warmup, nil); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	if err := waitCompleted(ctx, sys, o.warmup, o.timeout, "warm-up", log); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	fx := &fixture{pool: sys.obs, size: r.finished}
	if err := sys.obs.QueryRow(ctx, `SELECT id::text FROM jobs WHERE status = 'succeeded' AND result IS NOT NULL LIMIT 1`).
		Scan(&fx.template); err != nil {
		return fmt.Errorf("find a succeeded warm-up job: %w", err)
	}
	log("inserting %s finished jobs past their retention, with their attempts, events and keys", thousands(r.finished))
	began := time.Now()
	var err error
	if r.filled, err = fx.insert(ctx, r.finished, log); err != nil {
		return err
	}
	r.fillTime = time.Since(began)
	log("%s rows inserted in %s", thousands(int(r.filled.total())), seconds(r.fillTime))

	opt, err := asynq.ParseRedisURI(o.redisURL)
	if err != nil {
		return fmt.Errorf("parse redis url: %w", err)
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	r.statuses = map[string]int{}
	next := o.warmup
	for k := range o.runs {
		for _, on := range retentionOrder(k) {
			run, err := r.drain(ctx, sys, fx, insp, on, next, log)
			if err != nil {
				return err
			}
			r.runs = append(r.runs, run)
			next += o.n
		}
	}
	return nil
}

// drain measures one drain of jobs first..first+n-1 with the deleter on or off. The workers are
// stopped when it returns.
func (r *retention) drain(ctx context.Context, sys *llmqSystem, fx *fixture, insp *asynq.Inspector, on bool, first int, log logf) (retentionRun, error) {
	o, run := r.o, retentionRun{on: on}
	if err := sys.st.stopWorkers(); err != nil {
		return run, fmt.Errorf("stop the workers: %w", err)
	}
	added, err := fx.topUp(ctx)
	if err != nil {
		return run, err
	}
	if added > 0 {
		log("%s finished jobs inserted again", thousands(added))
	}
	if err := fx.vacuum(ctx); err != nil {
		return run, err
	}
	// Every backend of the last workers has exited and reported its counts by now (the top-up
	// and the vacuum took longer than a backend's exit).
	before, err := readDeletions(ctx, sys.obs)
	if err != nil {
		return run, err
	}
	mode := map[bool]string{false: "off", true: "on"}[on]
	log("retention %s: queueing %d jobs with no worker running", mode, o.n)
	start, err := closedLoop(o.clients)(ctx, sys, first, o.n, nil)
	if err != nil {
		return run, fmt.Errorf("queue the backlog: %w", err)
	}
	if err := insp.PauseQueue(sys.d.queue); err != nil {
		return run, fmt.Errorf("pause the queue: %w", err)
	}
	if err := sys.d.rewrite(retentionSetupFor(on)); err != nil {
		return run, err
	}
	if err := sys.st.startWorkers(ctx, o.workers); err != nil {
		return run, err
	}
	if !sleepUntil(ctx, time.Now().Add(retentionSettle)) {
		return run, context.Cause(ctx)
	}
	if on {
		if err := r.waitDeleting(ctx, sys); err != nil {
			return run, err
		}
	}
	d0, t0, err := r.deleted(ctx, sys)
	if err != nil {
		return run, err
	}
	meter := sys.meter()
	meter.api = 0 // idle during the drain
	c0 := meter.start(ctx)
	if err := insp.UnpauseQueue(sys.d.queue); err != nil {
		return run, fmt.Errorf("resume the queue: %w", err)
	}
	if err := waitDrained(ctx, sys, first+o.n, o.timeout, log, func(int) {}); err != nil {
		return run, err
	}
	d1, t1, err := r.deleted(ctx, sys)
	if err != nil {
		return run, err
	}
	run.cpu, run.jobs = meter.stop(ctx, c0), o.n
	run.jobsDeleted, run.window = d1-d0, t1.Sub(t0)
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		run.load = loadAverage(string(b))
	}
	ts, err := drainResults(ctx, sys, start, &run, r.statuses)
	if err != nil {
		return run, err
	}
	if len(ts) < 2 {
		return run, fmt.Errorf("%d results of %d jobs", len(ts), o.n)
	}
	run.rate = rateBetween(ts, 0, len(ts)-1)
	if err := sys.st.stopWorkers(); err != nil {
		return run, fmt.Errorf("stop the workers: %w", err)
	}
	if !sleepUntil(ctx, time.Now().Add(time.Second)) { // their backends exit and report
		return run, context.Cause(ctx)
	}
	after, err := readDeletions(ctx, sys.obs)
	if err != nil {
		return run, err
	}
	switch jobs := after.jobs - before.jobs; {
	case !on && jobs != 0:
		return run, fmt.Errorf("retention off, yet %d jobs were deleted", jobs)
	case on && (jobs == 0 || run.jobsDeleted <= 0):
		return run, fmt.Errorf("retention on, yet the deleter deleted %d jobs (%.0f during the drain)", jobs, run.jobsDeleted)
	case on:
		run.rowsPerJob = float64(after.rows-before.rows) / float64(jobs)
	}
	log("  drained at %.0f jobs/s; %.0f jobs deleted meanwhile; load average %s", run.rate, run.jobsDeleted, run.load)
	return run, nil
}

// waitDeleting waits until the workers have deleted their first jobs.
func (r *retention) waitDeleting(ctx context.Context, sys *llmqSystem) error {
	ctx, cancel := context.WithTimeout(ctx, retentionStartWithin)
	defer cancel()
	for {
		n, _, err := r.deleted(ctx, sys)
		if err == nil && n > 0 {
			return nil
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return fmt.Errorf("the retention pass deleted nothing within %s of the workers' start (%v): %w",
				retentionStartWithin, err, context.Cause(ctx))
		}
	}
}

// deleted reads how many jobs the running workers' retention passes have deleted, and when.
func (r *retention) deleted(ctx context.Context, sys *llmqSystem) (float64, time.Time, error) {
	var n float64
	err := scrapeMetrics(ctx, sys.hc, sys.st.metricsAddrs, func(mfs []*dto.MetricFamily) { n += counterSum(mfs, deletedMetric) })
	return n, time.Now(), err
}

// counterSum is the sum of every series of the counter name in mfs.
func counterSum(mfs []*dto.MetricFamily, name string) float64 {
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// drainResults reads the drained jobs (created since start): their finishing times, sorted,
// and each one's first attempt start → result into run.work; it counts their statuses into
// statuses.
func drainResults(ctx context.Context, sys *llmqSystem, start time.Time, run *retentionRun, statuses map[string]int) ([]time.Time, error) {
	rows, err := sys.obs.Query(ctx, `SELECT status, started_at, finished_at FROM jobs WHERE tenant = $1 AND created_at >= $2`,
		fixtureTenant, start)
	if err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	var ts []time.Time
	var status string
	var began, fin *time.Time
	if _, err := pgx.ForEachRow(rows, []any{&status, &began, &fin}, func() error {
		statuses[status]++
		if fin != nil {
			ts = append(ts, *fin)
			if began != nil {
				run.work = append(run.work, fin.Sub(*began))
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts, nil
}

// medianRun is the median run by drain rate of the runs with the deleter on or off (the lower
// middle for an even count); ok is false when there is none.
func (r *retention) medianRun(on bool) (retentionRun, bool) {
	var runs []retentionRun
	for _, run := range r.runs {
		if run.on == on {
			runs = append(runs, run)
		}
	}
	if len(runs) == 0 {
		return retentionRun{}, false
	}
	slices.SortStableFunc(runs, func(a, b retentionRun) int {
		switch {
		case a.rate < b.rate:
			return -1
		case a.rate > b.rate:
			return 1
		}
		return 0
	})
	return runs[(len(runs)-1)/2], true
}

// medianCPU is the median CPU ms per drained job of the runs with the deleter on or off; ok is
// false when none was measured.
func (r *retention) medianCPU(on bool) (float64, bool) {
	var vs []float64
	for _, run := range r.runs {
		if v, ok := run.cpuPerJob(); ok && run.on == on {
			vs = append(vs, v)
		}
	}
	return median(vs), len(vs) > 0
}

// roundRatios are the drain rate with the deleter over the rate without it in each round (a
// round is two consecutive runs, one of each).
func (r *retention) roundRatios() []float64 {
	var out []float64
	for k := 0; k+1 < len(r.runs); k += 2 {
		a, b := r.runs[k], r.runs[k+1]
		if a.on {
			a, b = b, a
		}
		if a.on || !b.on || a.rate <= 0 {
			continue
		}
		out = append(out, b.rate/a.rate)
	}
	return out
}

// ratio is the median drain rate with the deleter over the median without it; ok is false
// when a side has no run.
func (r *retention) ratio() (float64, bool) {
	on, okOn := r.medianRun(true)
	off, okOff := r.medianRun(false)
	if !okOn || !okOff || off.rate <= 0 {
		return 0, false
	}
	return on.rate / off.rate, true
}

// checks judges the measurement against the retention target.
func (r *retention) checks() []check {
	ratio, ok := r.ratio()
	return []check{{what: "drain with the deleter ÷ without", got: ratioText(ratio, ok), target: fmt.Sprintf("≥ %.2f", 1-retentionTarget),
		pass: ok && ratio >= 1-retentionTarget-1e-9}}
}

// retentionHeader is the header of the retention table.
var retentionHeader = []string{"retention pass", "finished jobs", "backlog", "drain jobs/s", "start→result p50", "p95",
	"jobs deleted during the drain", "rows deleted", "deleted jobs/s", "rows/s", "with ÷ without", "target"}

func (r *retention) report() report {
	var rows [][]string
	for _, on := range []bool{false, true} {
		run, ok := r.medianRun(on)
		if !ok {
			continue
		}
		name, ratio, target := "off", "—", ""
		deleted, rowsDeleted, jobsPerS, rowsPerS := "0", "0", "0", "0"
		if on {
			name = fmt.Sprintf("on, every %s, batches of 500", retentionInterval)
			deleted, rowsDeleted = fmt.Sprintf("%.0f", run.jobsDeleted), fmt.Sprintf("%.0f", run.rowsDeleted())
			jobsPerS, rowsPerS = fmt.Sprintf("%.0f", run.perSecond(run.jobsDeleted)), fmt.Sprintf("%.0f", run.perSecond(run.rowsDeleted()))
			v, ok := r.ratio()
			ratio, target = ratioText(v, ok), verdict(r.checks())
		}
		rows = append(rows, []string{name, thousands(r.finished), thousands(r.o.n), fmt.Sprintf("%.0f", run.rate),
			msText(percentile(run.work, 50)), msText(percentile(run.work, 95)), deleted, rowsDeleted, jobsPerS, rowsPerS, ratio, target})
	}
	notes := []string{
		fmt.Sprintf("llmq with %d workers, warmed up with %d jobs. The table: %s finished jobs past their retention "+
			"(%s attempts, %s events, %s idempotency keys: per job %.2f, %.2f and %.2f; 93 %% succeeded, 3 %% failed, 2 %% dead, "+
			"2 %% canceled), inserted with INSERT … SELECT generate_series in %s, topped up to %s and vacuumed (not timed) before each drain.",
			r.o.workers, r.o.warmup, thousands(r.finished), thousands(int(r.filled.attempts)), thousands(int(r.filled.events)),
			thousands(int(r.filled.keys)), fixtureAttemptsPerJob, fixtureEventsPerJob, fixtureKeysPerJob, seconds(r.fillTime),
			thousands(r.finished)),
		fmt.Sprintf("Each drain: %s jobs queued by %d clients with no worker running, the queue paused, the workers started with "+
			"retention off, or on with retention.interval %s (and the default periods), the queue resumed once the deleter had "+
			"deleted its first batch. Drain rate: first result to last, from the jobs' finished_at; start→result: each job's first "+
			"attempt start to its result (submit → result is the wait in the backlog). Deleted: the workers' %s between the "+
			"queue's resume and the last result, rows from Postgres's counts of the whole run (the job with its attempts, events "+
			"and key). %d runs each, interleaved (off, on, on, off, …); the median run is shown. Retention target: with ÷ without ≥ %.2f.",
			thousands(r.o.n), r.o.clients, retentionInterval, deletedMetric, r.o.runs, 1-retentionTarget),
	}
	if len(r.runs) > 0 {
		notes = append(notes, "Each run in order: "+r.runsText()+".")
	}
	if rs := r.roundRatios(); len(rs) > 0 {
		notes = append(notes, "With ÷ without, round by round: "+joinFormatted("%.2f", rs)+".")
	}
	cpuOff, okOff := r.medianCPU(false)
	cpuOn, okOn := r.medianCPU(true)
	if okOff && okOn && cpuOn > 0 {
		notes = append(notes, fmt.Sprintf("CPU per drained job, the workers' and the run database's backends' (the deleter's included), "+
			"median: %.2f ms without the deleter, %.2f ms with it; where the drain is bound by these CPUs the rates would stand at %.2f.",
			cpuOff, cpuOn, cpuOff/cpuOn))
	}
	notes = append(notes, checksNote("Retention target", r.checks()))
	if s := statusesNote(systemName(tpLLMQ), r.statuses); s != "" {
		notes = append(notes, s)
	}
	return report{tables: []table{{retentionHeader, rows}}, notes: notes}
}

// runsText lists every run: its side, drain rate, deletions and the load average at its end.
func (r *retention) runsText() string {
	parts := make([]string, 0, len(r.runs))
	for _, run := range r.runs {
		s := fmt.Sprintf("off %.0f jobs/s", run.rate)
		if run.on {
			s = fmt.Sprintf("on %.0f jobs/s, %.0f jobs deleted in %s", run.rate, run.jobsDeleted, seconds(run.window))
		}
		if run.load != "" {
			s += " (load " + run.load + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}
