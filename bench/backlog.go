package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/llmq/llmq/internal/executor"
)

// backlog is `bench backlog`: llmq's workers stopped, n jobs queued, the workers started again
// and the drain measured; then a small backlog the same way. The backlog target: the large
// backlog drains within 10 % of the small one's rate.
type backlog struct {
	o         tpOpts
	queueTime time.Duration   // submitting the backlog
	submit    []time.Duration // the submit calls
	startup   time.Duration   // worker start → first result
	overall   float64         // the large drain's rate: jobs/s from the first to the last result
	small     float64         // the small backlog's drain rate: the median drain
	smallAll  []float64       // jobs/s of each drain of the small backlog
	slices    []backlogSlice
	statuses  map[string]int
}

// The small backlog the drain is compared with is drained backlogSmallRuns times, each of
// backlogWindow jobs, started the same way; the median of their rates is compared. Each rate,
// first result to last, holds its own start-up and run-out, as an operator draining that
// backlog sees them. One small drain lasts well under a second, and single drains of the same
// code range widely (2184 to 3460 jobs/s), hence the median.
const (
	backlogWindow    = 1000
	backlogSmallRuns = 5
	backlogTarget    = 0.10 // the drain rate of the full backlog within 10 % of the small one's
)

func (b *backlog) flags(fs *flagSet, s *shared) {
	b.o.flags(fs, s, false)
	s.jobs(fs, 100_000, "jobs in the backlog")
	s.deadline(fs, 25*time.Minute, "cap on the warm-up and on each drain")
	fs.check(func() error {
		if s.n < 2*backlogWindow {
			return fmt.Errorf("-n: at least %d jobs (twice the small backlog)", 2*backlogWindow)
		}
		return nil
	})
}

func (b *backlog) run(ctx context.Context, log logf) error {
	if err := b.o.binaries(ctx, log); err != nil {
		return err
	}
	o := b.o
	sys := &llmqSystem{o: o, log: log}
	defer sys.close()
	if err := sys.prepare(ctx, o.n+o.warmup+backlogSmallRuns*backlogWindow); err != nil {
		return err
	}
	if o.warmup > 0 {
		if _, err := closedLoop(min(o.clients, o.warmup))(ctx, sys, o.n, o.warmup, nil); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		if err := waitCompleted(ctx, sys, o.warmup, o.timeout, "warm-up", log); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
	}
	if err := sys.st.stopWorkers(); err != nil {
		return fmt.Errorf("stop the workers: %w", err)
	}
	log("queueing %d jobs with no worker running (%d clients)", o.n, o.clients)
	stop := every(5*time.Second, func(d time.Duration) { log("  %4.0fs: %d/%d submitted", d.Seconds(), sys.submitted.Load(), o.n) })
	b.submit = make([]time.Duration, o.n)
	start, err := closedLoop(o.clients)(ctx, sys, 0, o.n, b.submit)
	stop()
	if err != nil {
		return fmt.Errorf("queue the backlog: %w", err)
	}
	b.queueTime = time.Since(start)
	log("%d jobs queued in %s; starting %d workers", o.n, seconds(b.queueTime), o.workers)

	// The baseline is read before the workers start (their CPU and histograms start at zero), and
	// waitDrained counts only after a second, so that no measurement competes with the drain's
	// first results: read then, with a COUNT over the whole backlog, they slowed its start.
	sampler, err := newDrainSampler(ctx, sys)
	if err != nil {
		log("  postgres CPU not measured: %v", err)
	}
	drainStart := time.Now()
	if err := sys.st.startWorkers(ctx, o.workers); err != nil {
		return err
	}
	if err := waitDrained(ctx, sys, o.warmup+o.n, o.timeout, log, func(done int) { sampler.sample(ctx, done-o.warmup) }); err != nil {
		return err
	}
	b.statuses = map[string]int{}
	ts, err := finishTimes(ctx, sys, start, b.statuses)
	if err != nil {
		return err
	}
	if len(ts) < 2 {
		return fmt.Errorf("%d results of %d jobs", len(ts), o.n)
	}
	b.startup = ts[0].Sub(drainStart)
	b.overall = rateBetween(ts, 0, len(ts)-1)
	b.slices = drainSlices(ts, sampler.samples, 10)
	for k := range backlogSmallRuns {
		small, err := b.drainSmall(ctx, sys, o.n+o.warmup+k*backlogWindow, log)
		if err != nil {
			return err
		}
		b.smallAll = append(b.smallAll, rateBetween(small, 0, len(small)-1))
	}
	b.small = median(b.smallAll)
	return nil
}

// drainSmall stops the workers, queues backlogWindow jobs (indices first on; every job before
// them has completed), starts the workers again and returns the finishing times of that drain.
func (b *backlog) drainSmall(ctx context.Context, sys *llmqSystem, first int, log logf) ([]time.Time, error) {
	if err := sys.st.stopWorkers(); err != nil {
		return nil, fmt.Errorf("stop the workers: %w", err)
	}
	log("queueing %d jobs with no worker running, for the comparison drain", backlogWindow)
	start, err := closedLoop(b.o.clients)(ctx, sys, first, backlogWindow, nil)
	if err != nil {
		return nil, fmt.Errorf("queue the small backlog: %w", err)
	}
	if err := sys.st.startWorkers(ctx, b.o.workers); err != nil {
		return nil, err
	}
	if err := waitDrained(ctx, sys, first+backlogWindow, b.o.timeout, log, func(int) {}); err != nil {
		return nil, err
	}
	return finishTimes(ctx, sys, start, b.statuses)
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

// waitDrained waits until want jobs completed, counting them (and calling sample with the
// count) every second from a second on, and logging progress every 5 s; it gives up after
// timeout.
func waitDrained(ctx context.Context, sys *llmqSystem, want int, timeout time.Duration, log logf, sample func(done int)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	began, lastLog := time.Now(), time.Now()
	done := 0
	for done < want {
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
		if time.Since(lastLog) >= 5*time.Second {
			log("  %4.0fs: %d/%d completed", time.Since(began).Seconds(), done, want)
			lastLog = time.Now()
		}
	}
	return nil
}

// ok reports whether the large backlog's drain rate is within the backlog target of the small
// one's.
func (b *backlog) ok() bool { return b.small > 0 && b.overall >= (1-backlogTarget)*b.small }

// backlogHeader and sliceHeader are the headers of the backlog's two tables.
var (
	backlogHeader = []string{"system", "backlog", "queued in", "submit call p50", "p99", "first result after", "drain jobs/s",
		"backlog of 1,000: drain jobs/s", "drain ÷ backlog of 1,000's", "target"}
	sliceHeader = []string{"results", "jobs/s", "worker CPU ms/job", "postgres CPU ms/job", "redis CPU ms/job", "load ms", "begin ms", "record ms"}
)

func (b *backlog) report() report {
	ratio := "—"
	if b.small > 0 {
		ratio = fmt.Sprintf("%.2f", b.overall/b.small)
	}
	row := []string{systemName(tpLLMQ), thousands(b.o.n), seconds(b.queueTime), msText(percentile(b.submit, 50)),
		msText(percentile(b.submit, 99)), msText(b.startup), fmt.Sprintf("%.0f", b.overall), fmt.Sprintf("%.0f", b.small), ratio,
		passText(b.ok())}
	notes := []string{
		fmt.Sprintf("llmq with %d workers, warmed up with %d jobs; %s jobs queued by %d clients with no worker running, then the "+
			"workers started; then %d backlogs of %s drained the same way (the median is compared). Drain rate: first result to last, "+
			"from the jobs' finished_at. Backlog target: drain ÷ the backlog of %s's ≥ %.2f.",
			b.o.workers, b.o.warmup, thousands(b.o.n), b.o.clients, backlogSmallRuns, thousands(backlogWindow), thousands(backlogWindow),
			1-backlogTarget),
	}
	if len(b.smallAll) > 1 {
		notes = append(notes, fmt.Sprintf("Backlog of %s, jobs/s of each drain: %s.", thousands(backlogWindow), joinFloats(b.smallAll)))
	}
	if s := statusesNote(systemName(tpLLMQ), b.statuses); s != "" {
		notes = append(notes, s)
	}
	return report{tables: []table{{backlogHeader, [][]string{row}}, {sliceHeader, b.sliceRows()}}, notes: notes}
}

// sliceRows are the rows of the tenths table.
func (b *backlog) sliceRows() [][]string {
	cpu := func(v float64) string {
		if v < 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f", v)
	}
	out := make([][]string, len(b.slices))
	for i, s := range b.slices {
		stage := func(name string) string {
			for _, st := range s.stages {
				if st.stage == name {
					return fmt.Sprintf("%.2f", st.meanMS)
				}
			}
			return "—"
		}
		out[i] = []string{fmt.Sprintf("%s–%s", thousands(s.from+1), thousands(s.to+1)), fmt.Sprintf("%.0f", s.rate),
			cpu(s.workersMS), cpu(s.postgresMS), cpu(s.redisMS), stage(executor.StageLoad), stage(executor.StageBegin), stage(executor.StageRecord)}
	}
	return out
}
