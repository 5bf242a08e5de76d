package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTPSubmitBody(t *testing.T) {
	t.Parallel()
	var body struct {
		Request     map[string]any `json:"request"`
		MaxAttempts int            `json:"max_attempts"`
		Timeout     string         `json:"timeout"`
	}
	require.NoError(t, json.Unmarshal(jobBody(messagesBody(7), llmqMaxAttempts, llmqJobTimeout), &body))
	require.Equal(t, "claude-bench", body.Request["model"])
	require.Equal(t, llmqMaxAttempts, body.MaxAttempts)
	d, err := time.ParseDuration(body.Timeout)
	require.NoError(t, err)
	require.GreaterOrEqual(t, d, time.Hour, "a backlog must not run into its jobs' deadline")
}

func TestParseProcStatCPU(t *testing.T) {
	t.Parallel()
	t.Run("NameWithSpacesAndParens", func(t *testing.T) {
		t.Parallel()
		// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
		stat := "4242 (my (odd) proc) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 37 0 0 20 0 8 0 100 0 0"
		d, err := parseProcStatCPU(stat)
		require.NoError(t, err)
		require.Equal(t, 287*clockTick, d)
		user, system, err := parseProcStatTimes(stat)
		require.NoError(t, err)
		require.Equal(t, []time.Duration{250 * clockTick, 37 * clockTick}, []time.Duration{user, system})
	})
	t.Run("Truncated", func(t *testing.T) {
		t.Parallel()
		_, err := parseProcStatCPU("1 (x) S 1 2 3")
		require.ErrorContains(t, err, "fields")
	})
	t.Run("NoName", func(t *testing.T) {
		t.Parallel()
		_, err := parseProcStatCPU("garbage")
		require.Error(t, err)
	})
	t.Run("Self", func(t *testing.T) {
		t.Parallel()
		if _, err := os.Stat("/proc/self/stat"); err != nil {
			t.Skip("no /proc here")
		}
		_, err := procCPU(os.Getpid())
		require.NoError(t, err)
	})
}

func TestParseRedisCPU(t *testing.T) {
	t.Parallel()
	info := "# CPU\r\nused_cpu_sys:1.500000\r\nused_cpu_user:2.250000\r\nused_cpu_sys_children:9.0\r\n"
	d, err := parseRedisCPU(info)
	require.NoError(t, err)
	require.Equal(t, 3750*time.Millisecond, d)
	_, err = parseRedisCPU("# CPU\r\nused_cpu_sys:1.5\r\n")
	require.Error(t, err)
}

func TestCPUSample_Sub(t *testing.T) {
	t.Parallel()
	a := cpuSample{cpuBench: time.Second, cpuRedis: 2 * time.Second}
	b := cpuSample{cpuBench: 3 * time.Second, cpuRedis: 5 * time.Second, cpuAPI: time.Second}
	require.Equal(t, cpuSample{cpuBench: 2 * time.Second, cpuRedis: 3 * time.Second}, b.sub(a), "a group missing from one sample is dropped")
}

func TestBackendCPU_Since(t *testing.T) {
	t.Parallel()
	before := backendCPU{1: time.Second, 2: 2 * time.Second, 3: time.Second}
	after := backendCPU{1: 3 * time.Second, 2: 2 * time.Second, 4: 500 * time.Millisecond}
	require.Equal(t, 2500*time.Millisecond, after.since(before), "growth of 1 and the whole of the new 4; the ended 3 is lost")
}

func TestTracker(t *testing.T) {
	t.Parallel()
	tr := newTracker(4)
	tr.submitted(0)
	since := time.Now()
	tr.submitted(1)
	tr.submitted(2)
	tr.completed(0)
	tr.completed(1)
	tr.completed(1) // a redelivery
	tr.completed(9) // out of range
	require.Equal(t, int64(2), tr.n.Load())
	out := tr.outcome(since)
	require.Len(t, out.lat, 1, "job 0 was submitted before since; job 2 has not completed")
	require.GreaterOrEqual(t, out.lat[0], time.Duration(0))
	require.False(t, out.last.Before(since))
}

func TestDrivers(t *testing.T) {
	t.Parallel()
	t.Run("ClosedLoopSubmitsEachOnce", func(t *testing.T) {
		t.Parallel()
		sys := newFakeSystem(120)
		lat := make([]time.Duration, 100)
		_, err := closedLoop(7)(context.Background(), sys, 20, 100, lat)
		require.NoError(t, err)
		require.Equal(t, 100, sys.submits())
		for i := range 120 {
			require.Equal(t, i >= 20, sys.seen(i), "job %d", i)
		}
	})
	t.Run("ClosedLoopStopsAtTheFirstError", func(t *testing.T) {
		t.Parallel()
		sys := newFakeSystem(1000)
		sys.failAt = 10
		_, err := closedLoop(4)(context.Background(), sys, 0, 1000, make([]time.Duration, 1000))
		require.ErrorIs(t, err, errFake)
		require.Less(t, sys.submits(), 1000)
	})
	t.Run("OpenLoopKeepsTheSchedule", func(t *testing.T) {
		t.Parallel()
		sys := newFakeSystem(20)
		var st openLoopStats
		start := time.Now()
		_, err := openLoop(1000, &st)(context.Background(), sys, 0, 20, make([]time.Duration, 20))
		require.NoError(t, err)
		require.Equal(t, 20, sys.submits())
		require.GreaterOrEqual(t, time.Since(start), scheduleOffset(19, 1000), "the last job is not sent before its time")
		require.GreaterOrEqual(t, st.spread, scheduleOffset(19, 1000))
	})
	t.Run("ScheduleOffset", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, time.Duration(0), scheduleOffset(0, 500))
		require.Equal(t, 2*time.Second, scheduleOffset(1000, 500))
	})
}

func TestRateBetweenAndSlices(t *testing.T) {
	t.Parallel()
	base := time.Unix(1000, 0)
	ts := make([]time.Time, 101)
	for i := range ts {
		ts[i] = base.Add(time.Duration(i) * 10 * time.Millisecond) // 100 jobs/s
	}
	require.InDelta(t, 100.0, rateBetween(ts, 0, 100), 1e-9)
	require.Zero(t, rateBetween(ts, 5, 5))
	require.Zero(t, rateBetween(ts, 0, 101))
	samples := []backlogSample{{done: 0}, {done: 50, workers: 100 * time.Millisecond, redis: 50 * time.Millisecond},
		{done: 101, workers: 300 * time.Millisecond, redis: 50 * time.Millisecond}}
	sl := drainSlices(ts, samples, 2)
	require.Len(t, sl, 2)
	require.Equal(t, backlogSlice{from: 0, to: 50, rate: 100, workersMS: 2, postgresMS: 0, redisMS: 1}, sl[0])
	require.InDelta(t, 100.0, sl[1].rate, 1e-9)
	require.InDelta(t, 200.0/51, sl[1].workersMS, 1e-9)

	// With the workers' stage histograms read at each sample, each slice has its stages' means
	samples[0].stages = map[string]stageTotal{}
	samples[1].stages = map[string]stageTotal{"load": {count: 50, sum: 0.05}, "begin": {count: 50, sum: 0.1}}
	samples[2].stages = map[string]stageTotal{"load": {count: 101, sum: 0.152}, "begin": {count: 50, sum: 0.1}}
	sl = drainSlices(ts, samples, 2)
	require.Len(t, sl[0].stages, 2)
	require.Equal(t, []string{"load", "begin"}, []string{sl[0].stages[0].stage, sl[0].stages[1].stage})
	require.InDelta(t, 1.0, sl[0].stages[0].meanMS, 1e-9)
	require.InDelta(t, 2.0, sl[0].stages[1].meanMS, 1e-9)
	require.Len(t, sl[1].stages, 1, "no begin in the second slice")
	require.Equal(t, uint64(51), sl[1].stages[0].count)
	require.InDelta(t, 2.0, sl[1].stages[0].meanMS, 1e-9)
	rows := (&backlog{slices: sl}).sliceRows()
	require.Equal(t, []string{"1.00", "2.00", "—"}, rows[0][5:])
	require.Equal(t, []string{"2.00", "—", "—"}, rows[1][5:])
}

func TestMeasure(t *testing.T) {
	t.Parallel()
	s := &shared{timeout: 10 * time.Second}
	sys := newFakeSystem(25)
	res := measure(context.Background(), tpOpts{shared: s, clients: 3, warmup: 5}, sys, tpAsynq, 20, closedLoop(3), func(string, ...any) {})
	require.NoError(t, res.err)
	require.Len(t, res.lat, 20, "warm-up jobs are not counted")
	require.Len(t, res.submit, 20)
	require.Positive(t, res.jobsPerSecond())
	require.True(t, sys.closed)
}

func TestMedianBy(t *testing.T) {
	t.Parallel()
	r := func(n int, el time.Duration, err error) tpResult { return tpResult{n: n, elapsed: el, err: err} }
	got := medianBy([]tpResult{r(100, time.Second, nil), r(100, 4*time.Second, nil), r(100, 2*time.Second, nil), r(0, 0, errFake)},
		tpResult.jobsPerSecond)
	require.InDelta(t, 50.0, got.jobsPerSecond(), 1e-9, "the failed run is left out; the lower middle of 25, 50, 100")
	require.ErrorIs(t, medianBy([]tpResult{r(0, 0, errFake)}, tpResult.jobsPerSecond).err, errFake)
}

// tpRun is a measured run of system id: perSecond jobs in one second, each with latency lat.
func tpRun(id string, perSecond int, lat time.Duration) tpResult {
	return tpResult{id: id, name: systemName(id), n: perSecond, elapsed: time.Second, lat: []time.Duration{lat}, submit: []time.Duration{ms(1)},
		cpu: cpuSample{cpuBench: time.Duration(perSecond) * 500 * time.Microsecond}}
}

func TestThroughputReport(t *testing.T) {
	t.Parallel()
	tp, _ := parse[*throughput](t, "throughput")
	tp.results = []tpResult{tpRun(tpAsynq, 8000, ms(5)), tpRun(tpRiver, 2000, ms(5)), tpRun(tpComposite, 3000, ms(5)),
		tpRun(tpHTTPFloor, 2400, ms(5)), tpRun(tpLLMQ, 2200, ms(5)), tpRun(tpServe, 2100, ms(5))}
	tp.rates = [][]float64{{8000, 7900, 8100}, nil, nil, nil, {2200}, nil}
	rep := tp.report()
	rows := rep.tables[0].rows
	require.Equal(t, []string{"0.28", "1.10", "0.73", "0.92", "—", "1.05"}, []string{rows[0][12], rows[1][12], rows[2][12], rows[3][12], rows[4][12], rows[5][12]},
		"llmq ÷ each system")
	require.Equal(t, []string{"0.50", "—"}, rows[0][7:9], "CPU seconds per 1,000 jobs; the api is not measured")
	notes := strings.Join(rep.notes, "\n")
	require.Contains(t, notes, "Throughput targets: llmq ÷ floor over HTTP 0.92 (target ≥ 0.9), llmq serve ÷ floor over HTTP 0.88 (target ≥ 0.9): FAIL (llmq serve ÷ floor over HTTP).",
		"each layout is judged")
	require.Contains(t, notes, "What the floor over HTTP leaves: floor over HTTP ÷ River 1.20, floor over HTTP ÷ floor 0.80, llmq ÷ floor over HTTP 0.92, llmq serve ÷ llmq 0.95.")
	require.Contains(t, notes, "jobs/s of each run: asynq 8000, 7900, 8100.")

	tp.results[4] = tpRun(tpLLMQ, 1000, ms(5))
	tp.results[4].stages = []stageTime{{stage: "pickup", count: 1000, meanMS: 4}, {stage: "call", count: 1000, meanMS: 1}}
	tp.results[3].err = errors.New("floor: boom")
	rep = tp.report()
	notes = strings.Join(rep.notes, "\n")
	require.NotContains(t, notes, "Throughput targets", "the floor over HTTP did not run: nothing is judged")
	require.Contains(t, notes, "floor over HTTP: POST → insert → asynq → provider → update: failed: floor: boom")
	require.Contains(t, notes, "llmq end to end: stage mean ms per delivery: pickup 4.00, call 1.00 (5.0 ms per job in all).")
	require.NotContains(t, notes, "system time", "not measured, not said")
	require.Equal(t, []string{tpHTTPFloor}, rep.failed)

	tp.results[4].cpu = cpuSample{cpuAPI: time.Second, cpuWorkers: 3 * time.Second, cpuSystem: 1600 * time.Millisecond}
	notes = strings.Join(tp.report().notes, "\n")
	require.Contains(t, notes, "llmq end to end: its processes' CPU 40% system time.", "the api's and the workers' system share")
	require.NotContains(t, notes, "WAL", "not measured, not said")

	tp.results[4].wal = walUse{bytes: 3_584_000, ok: true}
	notes = strings.Join(tp.report().notes, "\n")
	require.Contains(t, notes, "llmq end to end: Postgres's WAL 3.50 kB per job.", "the server's WAL over the 1,000 jobs")
}

// With -baseline-bin, the baseline build's rows are shown beside this build's without a ratio,
// the targets are judged on this build's alone, and jobs/s and CPU per job are compared by the
// median of the pairs' ratios.
func TestThroughputReport_BaselineBuild(t *testing.T) {
	t.Parallel()
	tp, _ := parse[*throughput](t, "throughput")
	base := tpRun(tpServe, 1000, ms(5))
	base.name += baselineSuffix
	base.baseline = true
	tp.results = []tpResult{tpRun(tpHTTPFloor, 2000, ms(5)), tpRun(tpLLMQ, 2200, ms(5)), tpRun(tpServe, 1900, ms(5)), base}
	tp.rates = [][]float64{{2000}, {2200}, {1900, 1800}, {1000, 1100}}
	tp.compared = []buildComparison{{name: systemName(tpServe), measures: throughputMeasures, pairs: []buildPair{
		{this: tpRun(tpServe, 1900, ms(5)), base: tpRun(tpServe, 1000, ms(5))},
		{this: tpRun(tpServe, 1800, ms(5)), base: tpRun(tpServe, 1100, ms(5))},
	}}}
	rep := tp.report()
	rows := rep.tables[0].rows
	require.Equal(t, []string{"1.10", "—", "1.16", "—"}, []string{rows[0][12], rows[1][12], rows[2][12], rows[3][12]},
		"llmq ÷ each system; the baseline's row has none")
	notes := strings.Join(rep.notes, "\n")
	require.Contains(t, notes, "llmq serve ÷ floor over HTTP 0.95 (target ≥ 0.9)", "judged on this build")
	require.Contains(t, notes, "llmq serve (baseline build) 1000, 1100")
	require.Contains(t, notes, "llmq serve: API and worker in each process, this build ÷ the baseline build, median of 2 "+
		"order-swapped pairs (each pair's): jobs/s 1.77 (1.90, 1.64), CPU per job 1.00 (1.00, 1.00).")

	tp.results[3].err = errFake
	require.Equal(t, []string{"serve (baseline build)"}, tp.report().failed)
}

func TestRateReport(t *testing.T) {
	t.Parallel()
	r, _ := parse[*rate](t, "rate")
	llmq := tpResult{id: tpLLMQ, name: systemName(tpLLMQ), n: 3, lat: []time.Duration{ms(4), ms(6), ms(40)}, submit: []time.Duration{ms(2), ms(3), ms(4)},
		toStart: []time.Duration{ms(3), ms(3), ms(30)}, fromStart: []time.Duration{ms(1), ms(3), ms(10)}}
	floor := llmq
	floor.id, floor.name, floor.toStart, floor.fromStart = tpHTTPFloor, systemName(tpHTTPFloor), nil, nil
	r.runs = []rateRun{{rate: 500, res: floor}, medianLatency(500, []tpResult{llmq, {err: errFake}})}
	rep := r.report()
	require.Equal(t, []string{"—", "FAIL"}, []string{rep.tables[0].rows[0][16], rep.tables[0].rows[1][16]}, "the targets are llmq's")
	require.Contains(t, rep.notes, "llmq end to end at 500/s: submits up to 0.0 ms late; created → first attempt started p50 3.0 ms, "+
		"p99 30.0 ms; started → finished p50 3.0 ms, p99 10.0 ms.")
	withSystem := r.runs[1]
	withSystem.res.cpu = cpuSample{cpuWorkers: 4 * time.Second, cpuSystem: time.Second}
	require.Contains(t, withSystem.note()[0], "; its processes' CPU 25% system time")
	withSystem.res.wal = walUse{bytes: 3 * 2048, ok: true}
	require.Contains(t, withSystem.note()[0], "; Postgres's WAL 2.00 kB per job")
	require.Equal(t, "FAIL", verdict(r.runs[1].checks(nil)), "p99 40 ms > 20 ms")
	llmq.lat[2] = ms(7)
	require.Equal(t, "PASS", verdict(rateRun{res: llmq}.checks(nil)))
	llmq.cpu, floor.cpu = cpuSample{cpuWorkers: 5 * time.Millisecond}, cpuSample{cpuBench: 3 * time.Millisecond}
	cs := rateRun{res: llmq}.checks(&rateRun{res: floor})
	require.Equal(t, check{what: "CPU per job ÷ floor over HTTP's", got: "1.67", target: "≤ 1.2"}, cs[3], "every group counts")
	floor.cpu[cpuRedis] = 2 * time.Millisecond
	require.Equal(t, "PASS", verdict(rateRun{res: llmq}.checks(&rateRun{res: floor})), "5 ms ≤ 1.2 × 5 ms")

	run := medianLatency(100, []tpResult{{lat: []time.Duration{ms(30), ms(30), ms(90)}}, {lat: []time.Duration{ms(10), ms(10), ms(200)}},
		{lat: []time.Duration{ms(20), ms(20), ms(50)}}})
	require.Equal(t, ms(20), percentile(run.res.lat, 50), "the median p50, not the median p99's run")
	require.Equal(t, [][2]time.Duration{{ms(30), ms(90)}, {ms(10), ms(200)}, {ms(20), ms(50)}}, run.each, "in the order run")
}

// With -baseline-bin, the baseline build's row is shown unjudged beside this build's, and each
// measure is compared by the median of the pairs' ratios (a pair with a failed run is left out).
func TestRateReport_BaselineBuild(t *testing.T) {
	t.Parallel()
	r, _ := parse[*rate](t, "rate")
	run := func(cpuMS, p50, started int) tpResult {
		return tpResult{id: tpServe, name: systemName(tpServe), n: 1, lat: []time.Duration{ms(p50)}, submit: []time.Duration{ms(1)},
			fromStart: []time.Duration{ms(started)}, cpu: cpuSample{cpuWorkers: ms(cpuMS)}}
	}
	base := medianLatency(500, []tpResult{run(4, 20, 4)})
	base.res.name += baselineSuffix
	base.res.baseline = true
	r.runs = []rateRun{medianLatency(500, []tpResult{run(3, 10, 2)}), base}
	r.compared = []buildComparison{{rate: 500, name: systemName(tpServe), measures: rateMeasures, pairs: []buildPair{
		{this: run(3, 10, 2), base: run(4, 20, 4)},
		{this: run(4, 12, 3), base: run(4, 12, 3)},
		{this: run(2, 9, 1), base: run(4, 10, 2)},
		{this: run(1, 1, 1), base: tpResult{err: errFake}},
	}}}
	rep := r.report()
	rows := rep.tables[0].rows
	require.Equal(t, "llmq serve: API and worker in each process (baseline build)", rows[1][0])
	require.Equal(t, []string{"FAIL", "—"}, []string{rows[0][16], rows[1][16]}, "the baseline build is not judged")
	require.Contains(t, rep.notes, "llmq serve: API and worker in each process at 500/s, this build ÷ the baseline build, "+
		"median of 3 order-swapped pairs (each pair's): CPU per job 0.75 (0.75, 1.00, 0.50), submit → result p50 0.90 "+
		"(0.50, 1.00, 0.90), started → finished p50 0.50 (0.50, 1.00, 0.50).")

	// A failed baseline run is named as the baseline's
	r.runs[1].res.err = errFake
	require.Equal(t, []string{"serve (baseline build) at 500/s"}, r.report().failed)

	// The order of a pair's runs alternates
	var order []string
	run0 := func(name string) func() tpResult {
		return func() tpResult { order = append(order, name); return tpResult{name: name} }
	}
	for k := range 4 {
		this, base := pairRuns(k, run0("this"), run0("base"))
		require.Equal(t, []string{"this", "base"}, []string{this.name, base.name})
	}
	require.Equal(t, []string{"this", "base", "base", "this", "this", "base", "base", "this"}, order)

	// No pair with both runs: nothing to say
	require.Empty(t, buildComparison{rate: 500, name: "x", measures: rateMeasures, pairs: []buildPair{{this: run(1, 1, 1), base: tpResult{err: errFake}}}}.note())
}

func TestBacklogReport(t *testing.T) {
	t.Parallel()
	b, _ := parse[*backlog](t, "backlog")
	b.small, b.overall, b.smallAll = 1400, 1300, []float64{1400, 1100, 1500}
	require.True(t, b.ok(), "1300 ≥ 0.9 × 1400")
	rep := b.report()
	require.Equal(t, []string{"1300", "1400", "0.93", "PASS"}, rep.tables[0].rows[0][6:])
	require.Contains(t, rep.notes, "Backlog of 1,000, jobs/s of each drain: 1400, 1100, 1500.")
	b.overall = 1190
	require.Equal(t, []string{"0.85", "FAIL"}, b.report().tables[0].rows[0][8:])
	require.False(t, (&backlog{overall: 950}).ok(), "no comparison drain, no pass")
}

var errFake = errors.New("fake submit failed")

// fakeSystem is an in-memory tpSystem: a job completes when it is submitted.
type fakeSystem struct {
	mu     sync.Mutex
	t      *tracker
	got    map[int]int
	failAt int // submits after this many fail; 0: never
	closed bool
}

func newFakeSystem(total int) *fakeSystem {
	return &fakeSystem{t: newTracker(total), got: map[int]int{}}
}

func (f *fakeSystem) prepare(context.Context, int) error { return nil }

func (f *fakeSystem) submit(_ context.Context, i int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAt > 0 && len(f.got) >= f.failAt {
		return errFake
	}
	f.got[i]++
	f.t.submitted(i)
	f.t.completed(i)
	return nil
}

func (f *fakeSystem) submits() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.got {
		n += c
	}
	return n
}

func (f *fakeSystem) seen(i int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got[i] == 1
}

func (f *fakeSystem) completed(context.Context) (int, error) { return int(f.t.n.Load()), nil }
func (f *fakeSystem) pollEvery() time.Duration               { return time.Millisecond }
func (f *fakeSystem) results(_ context.Context, since time.Time) (tpOutcome, error) {
	return f.t.outcome(since), nil
}
func (f *fakeSystem) meter() *cpuMeter { return &cpuMeter{} }
func (f *fakeSystem) close()           { f.closed = true }
