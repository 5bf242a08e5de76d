package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/jobs"
)

// backlogWindow is the small backlog the drain is compared with: a drain of only backlogWindow
// jobs, started the same way. The rates compared are the drain rates of each, first result to
// last: each holds its own start-up and run-out, amortised over its own size, as an operator
// draining that backlog sees them.
const backlogWindow = 1000

// backlogSmallRuns is how many times the small backlog is drained; the median of their rates is
// the one compared. One drain of backlogWindow jobs lasts well under a second; on these machines
// single drains of the same code ranged from 2184 to 3460 jobs/s.
const backlogSmallRuns = 5

// backlogSample is the drain's state at one moment, for the CPU per job as the backlog shrinks.
type backlogSample struct {
	done     int
	workers  time.Duration         // CPU of the worker processes since they started
	postgres time.Duration         // CPU of the database's backends since the drain started
	redis    time.Duration         // CPU of the Redis server (shared) since the drain started
	stages   map[string]stageTotal // the workers' stage histograms since they started (nil: not read)
}

// backlogSlice is one tenth of the drain.
type backlogSlice struct {
	from, to   int     // jobs [from, to) in finishing order
	rate       float64 // jobs/s over the slice
	workersMS  float64 // worker CPU ms per job over the slice; <0: not measured
	postgresMS float64 // postgres CPU ms per job over the slice; <0: not measured
	redisMS    float64 // Redis server CPU ms per job over the slice; <0: not measured
	// stages are the deliveries' mean time per stage over the slice (nil: not read)
	stages []stageTime
}

// tpBacklogReport is a finished backlog-mode run.
type tpBacklogReport struct {
	tpHead
	opts      tpOpts
	n         int
	queueTime time.Duration   // submitting the backlog
	submit    []time.Duration // the submit calls
	startup   time.Duration   // worker start → first result
	small     float64         // drain rate of a backlog of backlogWindow jobs (first result to last): the median drain
	smallAll  []float64       // jobs/s of each drain of the small backlog
	overall   float64         // the large drain's rate: jobs/s from the first to the last result
	slices    []backlogSlice
	statuses  map[string]int
}

// rateBetween is the rate of results i+1..j given their finishing times ts (sorted): (j − i) over
// ts[j] − ts[i]; 0 when the span is empty.
func rateBetween(ts []time.Time, i, j int) float64 {
	if i < 0 || j >= len(ts) || j <= i {
		return 0
	}
	d := ts[j].Sub(ts[i])
	if d <= 0 {
		return 0
	}
	return float64(j-i) / d.Seconds()
}

// cpuAt returns the CPU sample at the first moment at least done jobs had completed (the last
// sample when none reached it).
func cpuAt(samples []backlogSample, done int) backlogSample {
	for _, s := range samples {
		if s.done >= done {
			return s
		}
	}
	if len(samples) == 0 {
		return backlogSample{}
	}
	return samples[len(samples)-1]
}

// drainSlices cuts the finishing times ts into k slices with their rate and, from samples, the
// CPU per job.
func drainSlices(ts []time.Time, samples []backlogSample, k int) []backlogSlice {
	n := len(ts)
	if n < 2 || k < 1 {
		return nil
	}
	out := make([]backlogSlice, 0, k)
	for s := range k {
		from, to := s*n/k, min((s+1)*n/k, n-1)
		sl := backlogSlice{from: from, to: to, rate: rateBetween(ts, from, to), workersMS: -1, postgresMS: -1, redisMS: -1}
		a, b := cpuAt(samples, from), cpuAt(samples, to)
		if jobs := b.done - a.done; jobs > 0 {
			per := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(jobs) }
			sl.workersMS, sl.postgresMS, sl.redisMS = per(b.workers-a.workers), per(b.postgres-a.postgres), per(b.redis-a.redis)
			if a.stages != nil && b.stages != nil {
				sl.stages = stageTimes(a.stages, b.stages)
			}
		}
		out = append(out, sl)
	}
	return out
}

// runBacklogMode is `-mode backlog`: warm llmq up, stop its workers, queue o.n jobs, start the
// workers again and measure the drain.
func runBacklogMode(ctx context.Context, o tpOpts, stderr io.Writer) (tpBacklogReport, error) {
	rep := tpBacklogReport{opts: o, n: o.n}
	sys := &llmqSystem{o: o, stderr: stderr, workersAtStart: true}
	defer sys.close()
	if err := sys.prepare(ctx, o.n+o.warmup+backlogSmallRuns*backlogWindow); err != nil {
		return rep, err
	}
	if o.warmup > 0 {
		if _, err := closedLoop(min(o.clients, o.warmup))(ctx, sys, o.n, o.warmup, nil); err != nil {
			return rep, fmt.Errorf("warm-up: %w", err)
		}
		if err := waitCompleted(ctx, sys, o.warmup, o.timeout, "warm-up", stderr); err != nil {
			return rep, fmt.Errorf("warm-up: %w", err)
		}
	}
	if err := sys.stopWorkers(); err != nil {
		return rep, fmt.Errorf("stop the workers: %w", err)
	}
	tpLogf(stderr, "queueing %d jobs with no worker running (%d clients)", o.n, o.clients)
	stopProgress := submitProgress(stderr, sys, o.n)
	rep.submit = make([]time.Duration, o.n)
	start, err := closedLoop(o.clients)(ctx, sys, 0, o.n, rep.submit)
	stopProgress()
	if err != nil {
		return rep, fmt.Errorf("queue the backlog: %w", err)
	}
	rep.queueTime = time.Since(start)
	tpLogf(stderr, "%d jobs queued in %s; starting %d workers", o.n, seconds(rep.queueTime), o.workers)

	pg0, err := postgresBackends(ctx, o.dbURL, sys.dbName)
	if err != nil {
		tpLogf(stderr, "  postgres CPU not measured: %v", err)
	}
	// The baseline is read before the workers start (their CPU and histograms start at zero), and
	// waitDrained counts only after a second, so that no measurement competes with the drain's
	// first results. Read at the start, with a COUNT over the whole backlog, they slowed a
	// 100,000-job drain's first 600 results to 0.57–0.82 × a small drain's in most runs (three
	// runs since: 0.86–1.05 ×).
	var redis0 time.Duration
	if sys.rdb != nil {
		redis0, _ = redisCPU(ctx, sys.rdb)
	}
	samples := []backlogSample{{stages: map[string]stageTotal{}}}
	drainStart := time.Now()
	if err := sys.startWorkers(ctx); err != nil {
		return rep, err
	}
	sample := func(done int) {
		s := backlogSample{done: done}
		if sys.rdb != nil {
			if d, err := redisCPU(ctx, sys.rdb); err == nil {
				s.redis = d - redis0
			}
		}
		for _, pid := range sys.meter().workers {
			if d, err := procCPU(pid); err == nil {
				s.workers += d
			}
		}
		if pg0 != nil {
			if b, err := postgresBackends(ctx, o.dbURL, sys.dbName); err == nil {
				s.postgres = b.since(pg0)
			}
		}
		if t, ok := sys.stageTotals(ctx); ok {
			s.stages = t
		}
		samples = append(samples, s)
	}
	if err := waitDrained(ctx, sys, o.warmup+o.n, o.timeout, stderr, func(done int) { sample(done - o.warmup) }); err != nil {
		return rep, err
	}

	rep.statuses = map[string]int{}
	ts, err := finishTimes(ctx, sys, start, rep.statuses)
	if err != nil {
		return rep, err
	}
	for k := range backlogSmallRuns {
		small, err := drainSmallBacklog(ctx, sys, o, o.n+o.warmup+k*backlogWindow, stderr, rep.statuses)
		if err != nil {
			return rep, err
		}
		rep.smallAll = append(rep.smallAll, rateBetween(small, 0, len(small)-1))
	}
	rep.small = median(rep.smallAll)
	if len(ts) < 2*backlogWindow+1 {
		return rep, fmt.Errorf("%d results, want at least %d", len(ts), 2*backlogWindow+1)
	}
	rep.startup = ts[0].Sub(drainStart)
	rep.overall = rateBetween(ts, 0, len(ts)-1)
	rep.slices = drainSlices(ts, samples, 10)
	return rep, nil
}

// finishTimes returns the finishing times, sorted, of the jobs created since start, counting
// their statuses into statuses.
func finishTimes(ctx context.Context, sys *llmqSystem, start time.Time, statuses map[string]int) ([]time.Time, error) {
	rows, err := sys.obs.Query(ctx, `SELECT status, finished_at FROM jobs WHERE created_at >= $1`, start)
	if err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	var ts []time.Time
	var status string
	var fin *time.Time
	if _, err := pgx.ForEachRow(rows, []any{&status, &fin}, func() error {
		statuses[status]++
		if fin != nil {
			ts = append(ts, *fin)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts, nil
}

// median is the middle of vs (the mean of the two middle ones for an even count); 0 for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(vs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// drainSmallBacklog stops the workers, queues backlogWindow jobs (indices first on; every job
// before them has completed), starts the workers again and returns the finishing times of that
// drain, sorted, counting statuses into statuses.
func drainSmallBacklog(ctx context.Context, sys *llmqSystem, o tpOpts, first int, stderr io.Writer, statuses map[string]int) ([]time.Time, error) {
	if err := sys.stopWorkers(); err != nil {
		return nil, fmt.Errorf("stop the workers: %w", err)
	}
	tpLogf(stderr, "queueing %d jobs with no worker running, for the comparison drain", backlogWindow)
	start, err := closedLoop(o.clients)(ctx, sys, first, backlogWindow, nil)
	if err != nil {
		return nil, fmt.Errorf("queue the small backlog: %w", err)
	}
	if err := sys.startWorkers(ctx); err != nil {
		return nil, err
	}
	if err := waitDrained(ctx, sys, first+backlogWindow, o.timeout, stderr, func(int) {}); err != nil {
		return nil, err
	}
	return finishTimes(ctx, sys, start, statuses)
}

// submitProgress prints how many jobs were submitted every 5 s until stop is called.
func submitProgress(w io.Writer, sys *llmqSystem, n int) (stop func()) {
	quit, exited := make(chan struct{}), make(chan struct{})
	began := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				tpLogf(w, "  %4.0fs: %d/%d submitted", time.Since(began).Seconds(), sys.submitted.Load(), n)
			}
		}
	}()
	return func() { close(quit); <-exited }
}

// waitDrained waits until want jobs completed, counting them (and calling sample with the
// count) every second from a second on, and printing progress every 5 s; it gives up after
// timeout.
func waitDrained(ctx context.Context, sys *llmqSystem, want int, timeout time.Duration, w io.Writer, sample func(done int)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	began, lastLog := time.Now(), time.Now()
	done := 0
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain: %d/%d jobs completed after %s: %w", done, want, seconds(timeout), context.Cause(ctx))
		case <-tick.C:
		}
		n, err := sys.completed(ctx)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if err == nil {
			done = n
			sample(done)
		}
		if done >= want {
			return nil
		}
		if time.Since(lastLog) >= 5*time.Second {
			tpLogf(w, "  %4.0fs: %d/%d completed", time.Since(began).Seconds(), done, want)
			lastLog = time.Now()
		}
	}
}

var tpBacklogHeader = []string{"system", "backlog", "queued in", "submit call p50", "p99", "first result after",
	"drain jobs/s", fmt.Sprintf("backlog of %s: drain jobs/s", thousandsText(backlogWindow)),
	fmt.Sprintf("drain ÷ backlog of %s's", thousandsText(backlogWindow)), "target"}

// thousandsText renders 100000 as "100,000".
func thousandsText(n int) string {
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ok reports whether the large backlog's drain rate is within the target of the drain rate of a
// backlog of backlogWindow (the median drain).
func (r tpBacklogReport) ok() bool {
	return r.small > 0 && r.overall >= (1-tpTargetBacklog)*r.small
}

func (r tpBacklogReport) rows() [][]string {
	ratio := func(a, b float64) string {
		if b <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", a/b)
	}
	f := func(v float64) string { return fmt.Sprintf("%.0f", v) }
	return [][]string{{systemName(tpLLMQ), thousandsText(r.n), seconds(r.queueTime),
		msText(percentile(r.submit, 50)), msText(percentile(r.submit, 99)), msText(r.startup),
		f(r.overall), f(r.small), ratio(r.overall, r.small), passText(r.ok())}}
}

var tpSliceHeader = []string{"results", "jobs/s", "worker CPU ms/job", "postgres CPU ms/job", "redis CPU ms/job",
	"load ms", "begin ms", "record ms"}

func (r tpBacklogReport) sliceRows() [][]string {
	out := make([][]string, len(r.slices))
	for i, s := range r.slices {
		cpu := func(v float64) string {
			if v < 0 {
				return "—"
			}
			return fmt.Sprintf("%.2f", v)
		}
		stage := func(name string) string {
			for _, st := range s.stages {
				if st.stage == name {
					return fmt.Sprintf("%.2f", st.meanMS)
				}
			}
			return "—"
		}
		out[i] = []string{fmt.Sprintf("%s–%s", thousandsText(s.from+1), thousandsText(s.to+1)), fmt.Sprintf("%.0f", s.rate),
			cpu(s.workersMS), cpu(s.postgresMS), cpu(s.redisMS), stage(jobs.StageLoad), stage(jobs.StageBegin), stage(jobs.StageRecord)}
	}
	return out
}

func (r tpBacklogReport) notes() []string {
	o := r.opts
	notes := []string{
		fmt.Sprintf("llmq (as in the throughput table, %d worker processes) is warmed up with %d jobs, its workers are stopped, "+
			"%s jobs are submitted over HTTP by %d clients, then the workers start again. Drain rates come from the jobs' "+
			"finished_at in finishing order. Then the same again, %d times, with a backlog of %s. Compared: each backlog's "+
			"drain rate, first result to last (the small backlog's is the median of its drains), each with its own start-up "+
			"and run-out.",
			o.workers, o.warmup, thousandsText(r.n), o.clients, backlogSmallRuns, thousandsText(backlogWindow)),
		fmt.Sprintf("Target: the drain rate with the full backlog within %.0f%% of the drain rate with a backlog of %s (drain ÷ the backlog's ≥ %.2f).",
			tpTargetBacklog*100, thousandsText(backlogWindow), 1-tpTargetBacklog),
		"The tenths below: jobs/s over each tenth of the results; CPU per job of the worker processes (/proc) and of the " +
			"database's backends (pg_stat_activity pids), and of the whole Redis server (INFO cpu; shared with its other clients), " +
			"sampled every second. A cost that grows with the backlog shows as " +
			"higher CPU per job in the first tenths. load, begin and record: the deliveries' mean time reading the job, " +
			"recording the attempt's start and recording its outcome (the worker's " + stageMetric + ", scraped with the " +
			"CPU), the stages whose statements touch the jobs table and its indexes, waits for the batch in flight included.",
	}
	if len(r.smallAll) > 1 {
		list := func(vs []float64) string {
			out := make([]string, len(vs))
			for i, v := range vs {
				out[i] = fmt.Sprintf("%.0f", v)
			}
			return strings.Join(out, ", ")
		}
		notes = append(notes, fmt.Sprintf("Backlog of %s, jobs/s of each drain: %s.", thousandsText(backlogWindow), list(r.smallAll)))
	}
	if s := statusesNote(tpResult{name: systemName(tpLLMQ), statuses: r.statuses}); s != "" {
		notes = append(notes, s)
	}
	return notes
}

func (r tpBacklogReport) text() string {
	return "\n" + textTable(tpBacklogHeader, r.rows()) + "\n" + textTable(tpSliceHeader, r.sliceRows()) + "\n" + bullets(r.notes())
}

func (r tpBacklogReport) markdown() string {
	return "### Backlog: draining " + thousandsText(r.n) + " queued jobs\n\n" + r.markdownLine() +
		markdownTable(tpBacklogHeader, r.rows()) + "\n" + markdownTable(tpSliceHeader, r.sliceRows()) + "\n" + bullets(r.notes())
}
