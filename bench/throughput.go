package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// tpSystem is one queue under test in `bench throughput`: plain asynq, River, the composite
// floor or llmq. A system is prepared once per run, takes jobs by index, and reports how many
// completed and how long each took.
type tpSystem interface {
	// prepare builds a fresh system (its own database, queue, processes) for up to total jobs,
	// indices 0..total-1.
	prepare(ctx context.Context, total int) error
	// submit hands job i to the system and returns once it is accepted (committed, for the
	// systems with a store). It is safe for concurrent use.
	submit(ctx context.Context, i int) error
	// completed returns how many jobs have completed since prepare, or why the system cannot
	// go on (a process exited).
	completed(ctx context.Context) (int, error)
	// pollEvery is how often completed may be asked without the observer dominating.
	pollEvery() time.Duration
	// results returns submit → result of every job submitted at or after since, the time of the
	// last result, and the jobs' final statuses when the system has any.
	results(ctx context.Context, since time.Time) (tpOutcome, error)
	// meter samples the CPU of the system's processes.
	meter() *cpuMeter
	// close removes everything prepare created; it is idempotent.
	close()
}

// tpOutcome is what a system reports of its measured jobs.
type tpOutcome struct {
	lat      []time.Duration
	last     time.Time
	statuses map[string]int // nil: the system has no statuses (every completion is a success)
	// toStart and fromStart: see tpResult (nil when the system does not record a start).
	toStart, fromStart []time.Duration
}

// tpOpts are the flags of `bench throughput`.
type tpOpts struct {
	mode     string
	n        int
	nSet     bool // -n was given (backlog mode defaults to 100,000 otherwise)
	clients  int
	workers  int
	conns    int
	runs     int
	warmup   int
	rates    []float64
	duration time.Duration
	only     string
	bin      string
	build    bool
	write    string
	timeout  time.Duration
	dbURL    string
	redisURL string
	keepLogs bool
}

// Modes of `bench throughput`.
const (
	tpModeThroughput = "throughput"
	tpModeRate       = "rate"
	tpModeBacklog    = "backlog"
)

// Row ids of `bench throughput`.
const (
	tpAsynq     = "asynq"
	tpRiver     = "river"
	tpComposite = "composite"
	tpHTTPFloor = "httpfloor"
	tpLLMQ      = "llmq"
)

var tpRowIDs = []string{tpAsynq, tpRiver, tpComposite, tpHTTPFloor, tpLLMQ}

// backlogDefaultN is -n in backlog mode when not given.
const backlogDefaultN = 100_000

func parseThroughputFlags(args []string, stderr io.Writer) (tpOpts, error) {
	var o tpOpts
	fs := flag.NewFlagSet("throughput", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.mode, "mode", tpModeThroughput, "throughput: all systems as fast as they go; rate: llmq at a fixed -rate for -duration; "+
		"backlog: -n jobs queued with no worker, then drained")
	fs.IntVar(&o.n, "n", 5000, "jobs per system (backlog mode: 100000 unless given)")
	fs.IntVar(&o.clients, "clients", 64, "concurrent submitting clients (throughput and backlog modes)")
	fs.IntVar(&o.workers, "workers", 2, "llmq worker processes; the in-process queues get the same total concurrency (200 per worker)")
	fs.IntVar(&o.conns, "conns", 16, "Postgres pool size of the in-process River and composite rows")
	fs.IntVar(&o.runs, "runs", 1, "runs per system in throughput mode, and per system and rate in rate mode (interleaved); the run with the median jobs/s (throughput) or the median submit→result p50 (rate) is shown")
	fs.IntVar(&o.warmup, "warmup", 50, "jobs run through each system before it is measured (not counted)")
	rates := fs.String("rate", "500", "offered jobs per second (rate mode); several, comma-separated, give one row each")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long jobs are offered (rate mode)")
	fs.StringVar(&o.only, "only", "", "comma-separated systems to run (default: all in throughput mode; composite, httpfloor and llmq in rate mode; "+
		"llmq otherwise): "+strings.Join(tpRowIDs, ", "))
	fs.StringVar(&o.bin, "bin", "../bin", "directory holding the api and worker binaries (built there when missing)")
	fs.BoolVar(&o.build, "build", false, "build the api and worker binaries into -bin even when present")
	fs.StringVar(&o.write, "write", "", "Markdown file whose throughput section gets this mode's part (empty: don't write)")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "cap on each run's wait for its jobs, from its first submit")
	fs.StringVar(&o.dbURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres server (a database llmq_bench_<random> is created there per run and dropped)")
	fs.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis (unique queues per run; never flushed)")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the llmq runs' config and process logs (their directory is printed)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	fs.Visit(func(f *flag.Flag) {
		o.nSet = o.nSet || f.Name == "n"
	})
	var parseErr error
	o.rates, parseErr = parseRates(*rates)
	if o.mode == tpModeBacklog && !o.nSet {
		o.n = backlogDefaultN
	}
	switch {
	case !slices.Contains([]string{tpModeThroughput, tpModeRate, tpModeBacklog}, o.mode):
		return o, fmt.Errorf("-mode: unknown mode %q (throughput, rate, backlog)", o.mode)
	case o.n < 1:
		return o, errors.New("-n: must be at least 1")
	case o.mode == tpModeBacklog && o.n < 2*backlogWindow:
		return o, fmt.Errorf("-n: backlog mode needs at least %d jobs (two windows of %d)", 2*backlogWindow, backlogWindow)
	case o.clients < 1:
		return o, errors.New("-clients: must be at least 1")
	case o.workers < 1:
		return o, errors.New("-workers: must be at least 1")
	case o.conns < 2:
		return o, errors.New("-conns: must be at least 2")
	case o.runs < 1:
		return o, errors.New("-runs: must be at least 1")
	case o.warmup < 0:
		return o, errors.New("-warmup: must not be negative")
	case parseErr != nil:
		return o, parseErr
	case o.duration <= 0:
		return o, errors.New("-duration: must be positive")
	case o.timeout <= 0:
		return o, errors.New("-timeout: must be positive")
	}
	if _, err := o.selected(); err != nil {
		return o, err
	}
	return o, nil
}

// parseRates parses "100,500" into positive rates.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("-rate: %q is not a positive number of jobs per second", strings.TrimSpace(f))
		}
		out = append(out, v)
	}
	return out, nil
}

// tpRateRowIDs are the systems rate mode runs by default: llmq and the two floors its latency
// targets are measured against.
var tpRateRowIDs = []string{tpComposite, tpHTTPFloor, tpLLMQ}

// selected returns the systems to run, in table order.
func (o tpOpts) selected() ([]string, error) {
	if strings.TrimSpace(o.only) == "" {
		switch o.mode {
		case tpModeThroughput:
			return tpRowIDs, nil
		case tpModeRate:
			return tpRateRowIDs, nil
		}
		return []string{tpLLMQ}, nil
	}
	want := map[string]bool{}
	for id := range strings.SplitSeq(o.only, ",") {
		id = strings.TrimSpace(id)
		if !slices.Contains(tpRowIDs, id) {
			return nil, fmt.Errorf("-only: unknown system %q (systems: %s)", id, strings.Join(tpRowIDs, ", "))
		}
		want[id] = true
	}
	if o.mode == tpModeBacklog && (len(want) != 1 || !want[tpLLMQ]) {
		return nil, fmt.Errorf("-only: %s mode runs llmq only", o.mode)
	}
	var out []string
	for _, id := range tpRowIDs {
		if want[id] {
			out = append(out, id)
		}
	}
	return out, nil
}

// concurrency is the total number of jobs the queues run at once: llmq's default per worker
// process times the worker processes.
func (o tpOpts) concurrency() int { return 200 * o.workers }

// runThroughput is `bench throughput`.
func runThroughput(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseThroughputFlags(args, stderr)
	if err != nil {
		return err
	}
	ids, _ := o.selected()
	if slices.Contains(ids, tpLLMQ) {
		if err := ensureBinaries(ctx, o.bin, o.build, stderr); err != nil {
			return err
		}
	}
	command := strings.TrimSpace("go run . throughput " + strings.Join(args, " "))
	head := tpHead{command: command, date: time.Now(), machine: machine()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		head.load = loadAverage(string(b))
	}
	var part, body string
	switch o.mode {
	case tpModeThroughput:
		rep, err := runThroughputMode(ctx, o, ids, stderr)
		if err != nil {
			return err
		}
		rep.tpHead = head
		fmt.Fprint(stdout, rep.text())
		part, body = tpPartTable, rep.markdown()
	case tpModeRate:
		rep, err := runRateMode(ctx, o, ids, stderr)
		if err != nil {
			return err
		}
		rep.tpHead = head
		fmt.Fprint(stdout, rep.text())
		part, body = tpPartRate, rep.markdown()
	case tpModeBacklog:
		rep, err := runBacklogMode(ctx, o, stderr)
		if err != nil {
			return err
		}
		rep.tpHead = head
		fmt.Fprint(stdout, rep.text())
		part, body = tpPartBacklog, rep.markdown()
	}
	if o.write == "" {
		return nil
	}
	if err := writeThroughputPart(o.write, part, body); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "throughput: wrote the %s part to %s\n", o.mode, o.write)
	return nil
}

// tpLogf prints a progress line of the throughput scenario on stderr.
func tpLogf(w io.Writer, format string, args ...any) {
	fmt.Fprintf(w, "throughput: %s\n", fmt.Sprintf(format, args...))
}

// newSystem returns the system id.
func newSystem(o tpOpts, id string, stderr io.Writer) tpSystem {
	switch id {
	case tpAsynq:
		return &asynqSystem{inProcessQueue: inProcessQueue{o: o}}
	case tpRiver:
		return &riverSystem{inProcessQueue: inProcessQueue{o: o}}
	case tpComposite:
		return &compositeSystem{floorBase{inProcessQueue: inProcessQueue{o: o}}}
	case tpHTTPFloor:
		return &httpFloorSystem{floorBase: floorBase{inProcessQueue: inProcessQueue{o: o}}}
	}
	return &llmqSystem{o: o, stderr: stderr, workersAtStart: true}
}

// tpResult is one measured run of a system.
type tpResult struct {
	id, name string
	n        int
	elapsed  time.Duration   // first submit → last result
	lat      []time.Duration // submit → result, per job
	submit   []time.Duration // the submit call, per job
	cpu      cpuSample       // CPU spent per group during the measurement
	statuses map[string]int
	lag      time.Duration      // rate mode: the largest delay of a submit behind its schedule
	offered  time.Duration      // rate mode: first to last scheduled submit
	allRates []float64          // throughput mode: jobs/s of every run that completed
	allLat   [][2]time.Duration // rate mode: submit→result p50 and p99 of every run
	// toStart and fromStart split submit → result at the first attempt's start (llmq only: its
	// started_at): the wait before the call, and the call with the result's write.
	toStart, fromStart []time.Duration
	// stages is where the workers' deliveries spent their time (stageReporter systems only).
	stages []stageTime
	err    error
}

// jobsPerSecond is n over elapsed (0 when the run has no figure).
func (r tpResult) jobsPerSecond() float64 {
	if r.err != nil || r.elapsed <= 0 {
		return 0
	}
	return float64(r.n) / r.elapsed.Seconds()
}

// cpuPer1000 is the group's CPU seconds per 1,000 jobs; ok is false when it was not measured.
func (r tpResult) cpuPer1000(group string) (float64, bool) {
	d, ok := r.cpu[group]
	if !ok || r.n == 0 {
		return 0, false
	}
	return d.Seconds() * 1000 / float64(r.n), true
}

// driver feeds jobs to a system.
type driver func(ctx context.Context, sys tpSystem, first, n int, submitLat []time.Duration) (start time.Time, err error)

// closedLoop returns a driver in which clients goroutines each submit one job after another
// until n jobs (indices first..first+n-1) are submitted. It stops at the first error.
func closedLoop(clients int) driver {
	return func(ctx context.Context, sys tpSystem, first, n int, submitLat []time.Duration) (time.Time, error) {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range min(clients, n) {
			wg.Go(func() {
				for {
					k := int(next.Add(1) - 1)
					if k >= n || ctx.Err() != nil {
						return
					}
					t0 := time.Now()
					if err := sys.submit(ctx, first+k); err != nil {
						cancel(err)
						return
					}
					if submitLat != nil {
						submitLat[k] = time.Since(t0)
					}
				}
			})
		}
		wg.Wait()
		if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return start, err
		}
		return start, ctx.Err()
	}
}

// openLoopMaxInFlight caps the submits of the open-loop driver in flight; past it, submits
// start late (the lag reports it).
const openLoopMaxInFlight = 1024

// openLoopStats is what the open-loop driver saw of its own schedule.
type openLoopStats struct {
	lag    time.Duration // the largest delay of a submit behind its schedule
	spread time.Duration // first to last submit sent
}

// openLoop returns a driver that submits job k at start + k/rate, each in its own goroutine,
// whatever the system's answers: an offered load, not a closed loop. It fills st when done.
func openLoop(rate float64, st *openLoopStats) driver {
	return func(ctx context.Context, sys tpSystem, first, n int, submitLat []time.Duration) (time.Time, error) {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		sem := make(chan struct{}, openLoopMaxInFlight)
		var wg sync.WaitGroup
		start := time.Now()
		timer := time.NewTimer(0)
		defer timer.Stop()
	loop:
		for k := range n {
			at := start.Add(scheduleOffset(k, rate))
			timer.Reset(time.Until(at))
			select {
			case <-ctx.Done():
				break loop
			case <-timer.C:
			}
			select {
			case <-ctx.Done():
				break loop
			case sem <- struct{}{}:
			}
			now := time.Now()
			st.lag = max(st.lag, now.Sub(at))
			st.spread = now.Sub(start)
			wg.Go(func() {
				defer func() { <-sem }()
				t0 := time.Now()
				if err := sys.submit(ctx, first+k); err != nil {
					cancel(err)
					return
				}
				submitLat[k] = time.Since(t0)
			})
		}
		wg.Wait()
		if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
			return start, err
		}
		return start, ctx.Err()
	}
}

// scheduleOffset is when job k of an offered load of rate per second is due.
func scheduleOffset(k int, rate float64) time.Duration {
	return time.Duration(float64(k) / rate * float64(time.Second))
}

// measure prepares sys, warms it up with o.warmup jobs, then drives n jobs through it and
// waits for all of them. The system is closed when it returns.
func measure(ctx context.Context, o tpOpts, sys tpSystem, id, name string, n int, drive driver, stderr io.Writer) tpResult {
	res := tpResult{id: id, name: name, n: n}
	defer sys.close()
	if err := sys.prepare(ctx, n+o.warmup); err != nil {
		res.err = err
		return res
	}
	if o.warmup > 0 {
		if _, err := closedLoop(min(o.clients, o.warmup))(ctx, sys, n, o.warmup, nil); err != nil {
			res.err = fmt.Errorf("warm-up: %w", err)
			return res
		}
		if err := waitCompleted(ctx, sys, o.warmup, o.timeout, name+" warm-up", stderr); err != nil {
			res.err = fmt.Errorf("warm-up: %w", err)
			return res
		}
	}
	m := sys.meter()
	c0 := m.start(ctx)
	sr, _ := sys.(stageReporter)
	var stages0 map[string]stageTotal
	if sr != nil {
		if t, ok := sr.stageTotals(ctx); ok {
			stages0 = t
		}
	}
	res.submit = make([]time.Duration, n)
	start, err := drive(ctx, sys, 0, n, res.submit)
	if err == nil {
		tpLogf(stderr, "  %s: %d jobs submitted in %s", name, n, seconds(time.Since(start)))
		err = waitCompleted(ctx, sys, o.warmup+n, o.timeout-time.Since(start), name, stderr)
	}
	if err != nil {
		res.err = err
		return res
	}
	res.cpu = m.stop(ctx, c0)
	if stages0 != nil {
		if t, ok := sr.stageTotals(ctx); ok {
			res.stages = stageTimes(stages0, t)
		}
	}
	out, err := sys.results(ctx, start)
	if err != nil {
		res.err = err
		return res
	}
	if len(out.lat) != n {
		res.err = fmt.Errorf("%d results for %d jobs", len(out.lat), n)
		return res
	}
	res.lat, res.statuses, res.toStart, res.fromStart = out.lat, out.statuses, out.toStart, out.fromStart
	res.elapsed = out.last.Sub(start)
	return res
}

// waitCompleted polls sys until want jobs completed, printing progress every 2 s; it gives up
// after timeout. It polls every pollEvery, or every 10 × the poll's own time when that is longer,
// so that observing costs the system under test at most a tenth of a core (llmq's count of
// unfinished jobs takes tens of ms with a 100,000-job backlog).
func waitCompleted(ctx context.Context, sys tpSystem, want int, timeout time.Duration, name string, stderr io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, max(timeout, time.Second))
	defer cancel()
	began, lastLog := time.Now(), time.Now()
	for {
		polled := time.Now()
		done, err := sys.completed(ctx)
		wait := max(sys.pollEvery(), 10*time.Since(polled))
		if err != nil && ctx.Err() == nil {
			return err
		}
		if done >= want {
			return nil
		}
		if time.Since(lastLog) >= 2*time.Second {
			tpLogf(stderr, "  %s: %4.0fs: %d/%d completed", name, time.Since(began).Seconds(), done, want)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
				return fmt.Errorf("interrupted: %w", cause)
			}
			return fmt.Errorf("%s: %d/%d jobs completed after %s", name, done, want, seconds(timeout))
		case <-time.After(wait):
		}
	}
}

// systemName is the name of a system in the tables.
func systemName(id string) string {
	switch id {
	case tpAsynq:
		return "asynq, no-op handler"
	case tpRiver:
		return "River, no-op worker"
	case tpComposite:
		return "floor: insert → asynq → update"
	case tpHTTPFloor:
		return "floor over HTTP: POST → insert → asynq → provider → update"
	}
	return "llmq end to end"
}

// medianRun returns the run with the median jobs/s of runs that did not fail (the lower middle
// for an even count), or the first failure when all failed.
func medianRun(runs []tpResult) tpResult {
	var ok []tpResult
	for _, r := range runs {
		if r.err == nil {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return runs[0]
	}
	slices.SortStableFunc(ok, func(a, b tpResult) int {
		switch x, y := a.jobsPerSecond(), b.jobsPerSecond(); {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	return ok[(len(ok)-1)/2]
}

// runThroughputMode runs every selected system o.runs times and keeps the median run of each.
func runThroughputMode(ctx context.Context, o tpOpts, ids []string, stderr io.Writer) (tpReport, error) {
	rep := tpReport{opts: o}
	tpLogf(stderr, "%d jobs per system, %d clients, %d runs, instant provider", o.n, o.clients, o.runs)
	for i, id := range ids {
		var runs []tpResult
		for r := range o.runs {
			if ctx.Err() != nil {
				return rep, fmt.Errorf("interrupted: %w", context.Cause(ctx))
			}
			tpLogf(stderr, "[%d/%d] %s: run %d/%d", i+1, len(ids), systemName(id), r+1, o.runs)
			res := measure(ctx, o, newSystem(o, id, stderr), id, systemName(id), o.n, closedLoop(o.clients), stderr)
			if res.err != nil {
				tpLogf(stderr, "[%d/%d] %s: error: %v", i+1, len(ids), systemName(id), res.err)
			} else {
				tpLogf(stderr, "[%d/%d] %s: %.0f jobs/s, p50 %s, p99 %s", i+1, len(ids), systemName(id),
					res.jobsPerSecond(), msText(percentile(res.lat, 50)), msText(percentile(res.lat, 99)))
			}
			runs = append(runs, res)
		}
		best := medianRun(runs)
		for _, r := range runs {
			if r.err == nil {
				best.allRates = append(best.allRates, r.jobsPerSecond())
			}
		}
		rep.results = append(rep.results, best)
	}
	if ctx.Err() != nil {
		return rep, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	var failed []string
	for _, r := range rep.results {
		if r.err != nil {
			failed = append(failed, r.id)
		}
	}
	if len(failed) > 0 {
		fmt.Fprint(stderr, rep.text())
		return rep, fmt.Errorf("systems did not run: %s", strings.Join(failed, ", "))
	}
	return rep, nil
}
