package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The throughput scenarios (throughput, rate, backlog) put jobs through queues with an instant
// provider: llmq end to end, plain asynq, River, and two floors (the least a store-then-queue
// design must do, without and with llmq's two HTTP hops).

// tpSystem is one queue under test. A system is prepared once per run, takes jobs by index,
// and reports how many completed and how long each took.
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

// tpOpts are the flags of the throughput scenarios: the shared ones and their own.
type tpOpts struct {
	*shared
	clients int // concurrent submitting clients (closed loop)
	conns   int // Postgres pool of the in-process queues
	warmup  int // jobs run through a system before it is measured
	// gomaxprocs is each llmq process's GOMAXPROCS (0: Go's default).
	gomaxprocs int
}

// flags registers the throughput flags; conns only for the scenarios with in-process queues.
func (o *tpOpts) flags(fs *flagSet, s *shared, conns bool) {
	o.shared = s
	s.base(fs, 2)
	s.redis(fs)
	fs.intAtLeast(&o.clients, "clients", 64, 1, "concurrent submitting clients (and warm-up clients)")
	fs.intAtLeast(&o.warmup, "warmup", 50, 0, "jobs run through each system before it is measured (not counted)")
	fs.intAtLeast(&o.gomaxprocs, "gomaxprocs", 0, 0, "GOMAXPROCS of each llmq process (0: Go's default, the machine's cores)")
	if conns {
		fs.intAtLeast(&o.conns, "conns", 16, 2, "Postgres pool size of the in-process River and floor rows")
	}
}

// concurrency is the total number of jobs the queues run at once: llmq's default per worker
// process times the worker processes.
func (o tpOpts) concurrency() int { return 200 * o.workers }

// Row ids of the throughput scenarios.
const (
	tpAsynq     = "asynq"
	tpRiver     = "river"
	tpComposite = "composite"
	tpHTTPFloor = "httpfloor"
	tpRiverHTTP = "riverhttp"
	tpLLMQ      = "llmq"
	tpServe     = "serve"
)

// tpIDs are the systems in table order.
func tpIDs() []string {
	return []string{tpAsynq, tpRiver, tpComposite, tpHTTPFloor, tpRiverHTTP, tpLLMQ, tpServe}
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
	case tpRiverHTTP:
		return "River over HTTP: POST → River insert → 2 worker processes → provider → RecordOutput"
	case tpServe:
		return "llmq serve: API and worker in each process"
	}
	return "llmq end to end"
}

// shortName is the name of a system in the notes.
func shortName(id string) string {
	switch id {
	case tpComposite:
		return "floor"
	case tpHTTPFloor:
		return "floor over HTTP"
	case tpRiver:
		return "River"
	case tpRiverHTTP:
		return "River over HTTP"
	case tpServe:
		return "llmq serve"
	}
	return id
}

// newSystem returns the system id.
func newSystem(o tpOpts, id string, log logf) tpSystem {
	q := inProcessQueue{o: o}
	switch id {
	case tpAsynq:
		return &asynqSystem{inProcessQueue: q}
	case tpRiver:
		return &riverSystem{inProcessQueue: q}
	case tpComposite:
		return &compositeSystem{floorBase{inProcessQueue: q}}
	case tpHTTPFloor:
		return &httpFloorSystem{floorBase: floorBase{inProcessQueue: q}}
	case tpRiverHTTP:
		return &riverHTTPSystem{o: o, log: log}
	case tpServe:
		return &llmqSystem{o: o, log: log, serve: true}
	}
	return &llmqSystem{o: o, log: log}
}

// tpResult is one measured run of a system.
type tpResult struct {
	id, name string
	baseline bool // run with -baseline-bin's binaries: shown, not judged
	n        int
	elapsed  time.Duration   // first submit → last result
	lat      []time.Duration // submit → result, per job
	submit   []time.Duration // the submit call, per job
	cpu      cpuSample       // CPU spent per group during the measurement
	wal      walUse          // the Postgres server's WAL written during the measurement
	statuses map[string]int
	lag      time.Duration // rate: the largest delay of a submit behind its schedule
	offered  time.Duration // rate: first to last scheduled submit
	// toStart and fromStart split submit → result at the attempt's start (llmq: its first
	// attempt's started_at; River over HTTP: its last attempt's attempted_at): the wait before
	// the call, and the call with the result's write.
	toStart, fromStart []time.Duration
	// stages is where the workers' deliveries spent their time (llmq only).
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

// driver feeds jobs first..first+n-1 to a system, recording each submit call's time in
// submitLat (when not nil), and returns when the first was sent.
type driver func(ctx context.Context, sys tpSystem, first, n int, submitLat []time.Duration) (start time.Time, err error)

// closedLoop returns a driver in which clients goroutines each submit one job after another
// until n jobs are submitted. It stops at the first error.
func closedLoop(clients int) driver {
	return func(ctx context.Context, sys tpSystem, first, n int, submitLat []time.Duration) (time.Time, error) {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range min(clients, n) {
			wg.Go(func() {
				for k := int(next.Add(1) - 1); k < n && ctx.Err() == nil; k = int(next.Add(1) - 1) {
					if err := timedSubmit(ctx, sys, first+k, submitLat, k); err != nil {
						cancel(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return start, driverErr(ctx)
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
// whatever the system's answers: an offered load, not a closed loop. It fills st.
func openLoop(rate float64, st *openLoopStats) driver {
	return func(ctx context.Context, sys tpSystem, first, n int, submitLat []time.Duration) (time.Time, error) {
		ctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		sem := make(chan struct{}, openLoopMaxInFlight)
		var wg sync.WaitGroup
		start := time.Now()
		for k := range n {
			at := start.Add(scheduleOffset(k, rate))
			if !sleepUntil(ctx, at) {
				break
			}
			select {
			case <-ctx.Done():
			case sem <- struct{}{}:
			}
			if ctx.Err() != nil {
				break
			}
			now := time.Now()
			st.lag, st.spread = max(st.lag, now.Sub(at)), now.Sub(start)
			wg.Go(func() {
				defer func() { <-sem }()
				if err := timedSubmit(ctx, sys, first+k, submitLat, k); err != nil {
					cancel(err)
				}
			})
		}
		wg.Wait()
		return start, driverErr(ctx)
	}
}

// timedSubmit submits job i, recording the call's time in lat[k] when lat is not nil.
func timedSubmit(ctx context.Context, sys tpSystem, i int, lat []time.Duration, k int) error {
	t0 := time.Now()
	if err := sys.submit(ctx, i); err != nil {
		return err
	}
	if lat != nil {
		lat[k] = time.Since(t0)
	}
	return nil
}

// driverErr is the error that stopped a driver: the first submit's failure, or the end of the
// caller's context.
func driverErr(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

// scheduleOffset is when job k of an offered load of rate per second is due.
func scheduleOffset(k int, rate float64) time.Duration {
	return time.Duration(float64(k) / rate * float64(time.Second))
}

// measure prepares sys, warms it up with o.warmup jobs, then drives n jobs through it and
// waits for all of them. The system is closed when it returns.
func measure(ctx context.Context, o tpOpts, sys tpSystem, id string, n int, drive driver, log logf) tpResult {
	res := tpResult{id: id, name: systemName(id), n: n}
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
		if err := waitCompleted(ctx, sys, o.warmup, o.timeout, res.name+" warm-up", log); err != nil {
			res.err = fmt.Errorf("warm-up: %w", err)
			return res
		}
	}
	m := sys.meter()
	c0 := m.start(ctx)
	l, _ := sys.(*llmqSystem)
	var stages0 map[string]stageTotal
	if l != nil {
		stages0, _ = l.stageTotals(ctx)
	}
	res.submit = make([]time.Duration, n)
	start, err := drive(ctx, sys, 0, n, res.submit)
	if err == nil {
		log("  %s: %d jobs submitted in %s", res.name, n, seconds(time.Since(start)))
		err = waitCompleted(ctx, sys, o.warmup+n, o.timeout-time.Since(start), res.name, log)
	}
	if err != nil {
		res.err = err
		return res
	}
	res.cpu = m.stop(ctx, c0)
	res.wal = m.wal(ctx)
	if stages0 != nil {
		if t, ok := l.stageTotals(ctx); ok {
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

// waitCompleted polls sys until want jobs completed, logging progress every 2 s; it gives up
// after timeout. It polls every pollEvery, or every 10 × the poll's own time when that is
// longer, so that observing costs the system under test at most a tenth of a core (llmq's count
// of unfinished jobs takes tens of ms with a 100,000-job backlog).
func waitCompleted(ctx context.Context, sys tpSystem, want int, timeout time.Duration, name string, log logf) error {
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
			log("  %s: %4.0fs: %d/%d completed", name, time.Since(began).Seconds(), done, want)
			lastLog = time.Now()
		}
		if !sleepUntil(ctx, time.Now().Add(wait)) {
			if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
				return fmt.Errorf("interrupted: %w", cause)
			}
			return fmt.Errorf("%s: %d/%d jobs completed after %s", name, done, want, seconds(timeout))
		}
	}
}

// median run of runs that did not fail, by key (the lower middle for an even count); the
// first failure when all failed.
func medianBy(runs []tpResult, key func(tpResult) float64) tpResult {
	ok := slices.DeleteFunc(slices.Clone(runs), func(r tpResult) bool { return r.err != nil })
	if len(ok) == 0 {
		return runs[0]
	}
	slices.SortStableFunc(ok, func(a, b tpResult) int {
		switch x, y := key(a), key(b); {
		case x < y:
			return -1
		case x > y:
			return 1
		}
		return 0
	})
	return ok[(len(ok)-1)/2]
}

// statusesNote names final statuses other than succeeded, or "".
func statusesNote(name string, statuses map[string]int) string {
	var other []string
	for _, s := range slices.Sorted(maps.Keys(statuses)) {
		if s != "succeeded" {
			other = append(other, fmt.Sprintf("%d %s", statuses[s], s))
		}
	}
	if len(other) == 0 {
		return ""
	}
	return fmt.Sprintf("%s: not every job succeeded: %s.", name, strings.Join(other, ", "))
}
