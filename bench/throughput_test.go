package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseThroughputFlags(t *testing.T) {
	t.Parallel()
	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		o, err := parseThroughputFlags(nil, &bytes.Buffer{})
		require.NoError(t, err)
		require.Equal(t, tpModeThroughput, o.mode)
		require.Equal(t, 5000, o.n)
		require.Equal(t, 64, o.clients)
		require.Equal(t, 2, o.workers)
		require.Equal(t, 400, o.concurrency())
		ids, err := o.selected()
		require.NoError(t, err)
		require.Equal(t, []string{tpAsynq, tpRiver, tpComposite, tpHTTPFloor, tpLLMQ}, ids)
	})
	t.Run("BacklogDefaultsTo100k", func(t *testing.T) {
		t.Parallel()
		o, err := parseThroughputFlags([]string{"-mode", "backlog"}, &bytes.Buffer{})
		require.NoError(t, err)
		require.Equal(t, backlogDefaultN, o.n)
		o, err = parseThroughputFlags([]string{"-mode", "backlog", "-n", "5000"}, &bytes.Buffer{})
		require.NoError(t, err)
		require.Equal(t, 5000, o.n, "an explicit -n wins")
	})
	t.Run("RateRunsLLMQAndTheFloors", func(t *testing.T) {
		t.Parallel()
		o, err := parseThroughputFlags([]string{"-mode", "rate", "-rate", "100, 500", "-duration", "4s"}, &bytes.Buffer{})
		require.NoError(t, err)
		require.Equal(t, []float64{100, 500}, o.rates)
		ids, err := o.selected()
		require.NoError(t, err)
		require.Equal(t, []string{tpComposite, tpHTTPFloor, tpLLMQ}, ids)
		o, err = parseThroughputFlags([]string{"-mode", "rate", "-only", "llmq"}, &bytes.Buffer{})
		require.NoError(t, err)
		ids, _ = o.selected()
		require.Equal(t, []string{tpLLMQ}, ids)
	})
	t.Run("BacklogRunsLLMQOnly", func(t *testing.T) {
		t.Parallel()
		_, err := parseThroughputFlags([]string{"-mode", "backlog", "-only", "asynq"}, &bytes.Buffer{})
		require.ErrorContains(t, err, "backlog mode runs llmq only")
	})
	t.Run("OnlyInTableOrder", func(t *testing.T) {
		t.Parallel()
		o, err := parseThroughputFlags([]string{"-only", "llmq, asynq"}, &bytes.Buffer{})
		require.NoError(t, err)
		ids, err := o.selected()
		require.NoError(t, err)
		require.Equal(t, []string{tpAsynq, tpLLMQ}, ids)
	})
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"UnknownMode":    {[]string{"-mode", "fast"}, `unknown mode "fast"`},
		"ZeroJobs":       {[]string{"-n", "0"}, "-n: must be at least 1"},
		"SmallBacklog":   {[]string{"-mode", "backlog", "-n", "1500"}, "at least 2000 jobs"},
		"NoClients":      {[]string{"-clients", "0"}, "-clients"},
		"NoRuns":         {[]string{"-runs", "0"}, "-runs"},
		"UnknownSystem":  {[]string{"-only", "sidekiq"}, `unknown system "sidekiq"`},
		"NegativeRate":   {[]string{"-rate", "-1"}, "-rate"},
		"BadRateList":    {[]string{"-rate", "100,fast"}, `"fast" is not a positive number`},
		"ExtraArguments": {[]string{"now"}, "unexpected arguments"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := parseThroughputFlags(tc.args, &bytes.Buffer{})
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestRun_ThroughputBadFlag(t *testing.T) {
	t.Parallel()
	var out, errOut bytes.Buffer
	require.ErrorContains(t, run(context.Background(), []string{"throughput", "-mode", "x"}, &out, &errOut), "unknown mode")
	require.Empty(t, out.String())
}

func TestTPSubmitBody(t *testing.T) {
	t.Parallel()
	var body struct {
		Request     map[string]any `json:"request"`
		MaxAttempts int            `json:"max_attempts"`
		Timeout     string         `json:"timeout"`
	}
	require.NoError(t, json.Unmarshal(tpSubmitBody(7), &body))
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

func TestMeasure(t *testing.T) {
	t.Parallel()
	o := tpOpts{clients: 3, warmup: 5, timeout: 10 * time.Second}
	sys := newFakeSystem(25)
	res := measure(context.Background(), o, sys, "fake", "fake", 20, closedLoop(3), &bytes.Buffer{})
	require.NoError(t, res.err)
	require.Len(t, res.lat, 20, "warm-up jobs are not counted")
	require.Len(t, res.submit, 20)
	require.Positive(t, res.jobsPerSecond())
	require.True(t, sys.closed)
}

func TestMedianRun(t *testing.T) {
	t.Parallel()
	r := func(n int, el time.Duration, err error) tpResult { return tpResult{n: n, elapsed: el, err: err} }
	got := medianRun([]tpResult{r(100, time.Second, nil), r(100, 4*time.Second, nil), r(100, 2*time.Second, nil), r(0, 0, errFake)})
	require.InDelta(t, 50.0, got.jobsPerSecond(), 1e-9)
	require.ErrorIs(t, medianRun([]tpResult{r(0, 0, errFake)}).err, errFake)
}

func TestTPReport(t *testing.T) {
	t.Parallel()
	res := func(id string, perSecond int) tpResult {
		return tpResult{id: id, name: systemName(id), n: perSecond, elapsed: time.Second,
			lat: []time.Duration{ms(5)}, submit: []time.Duration{ms(1)}, cpu: cpuSample{cpuBench: time.Duration(perSecond) * 500 * time.Microsecond}}
	}
	rep := tpReport{opts: tpOpts{n: 1000, workers: 2, conns: 16, clients: 64}, results: []tpResult{
		res(tpAsynq, 8000), res(tpRiver, 2000), res(tpComposite, 3000), res(tpLLMQ, 2100),
	}}
	rows := rep.rows()
	require.Equal(t, "0.26", rows[0][len(rows[0])-1])
	require.Equal(t, "1.05", rows[1][len(rows[1])-1])
	require.Equal(t, "0.70", rows[2][len(rows[2])-1])
	require.Equal(t, "—", rows[3][len(rows[3])-1])
	require.Equal(t, "0.50", rows[0][7], "CPU seconds per 1,000 jobs")
	require.Equal(t, "—", rows[0][8], "not measured")
	notes := strings.Join(rep.notes(), "\n")
	require.Contains(t, notes, "Target llmq ≥ 0.6 × the floor: 0.70 × — PASS")
	require.Contains(t, notes, "Target llmq ≥ 1.0 × River: 1.05 × — PASS")

	require.NotContains(t, notes, "Floor over HTTP ÷", "no floor over HTTP ran")

	rep.results[3] = res(tpLLMQ, 1000)
	notes = strings.Join(rep.notes(), "\n")
	require.Contains(t, notes, "0.33 × — FAIL")
	require.Contains(t, notes, "0.50 × — FAIL")
	require.Contains(t, rep.markdown(), "| llmq end to end |")
	require.NotContains(t, notes, "worker stages", "no stages were read")

	rep.results[3].stages = []stageTime{{stage: "pickup", count: 1000, meanMS: 4}, {stage: "call", count: 1000, meanMS: 1}}
	require.Contains(t, strings.Join(rep.notes(), "\n"), "llmq end to end (the run shown): worker stages, mean time per delivery")
}

func TestTPReport_FloorOverHTTP(t *testing.T) {
	t.Parallel()
	res := func(id string, perSecond int) tpResult {
		return tpResult{id: id, name: systemName(id), n: perSecond, elapsed: time.Second,
			lat: []time.Duration{ms(5)}, submit: []time.Duration{ms(1)}}
	}
	rep := tpReport{opts: tpOpts{n: 1000, workers: 2, conns: 16, clients: 64}, results: []tpResult{
		res(tpRiver, 2000), res(tpComposite, 2000), res(tpHTTPFloor, 1600), res(tpLLMQ, 800),
	}}
	require.Equal(t, "0.50", rep.rows()[2][len(tpHeader)-1], "llmq ÷ the floor over HTTP")
	notes := strings.Join(rep.notes(), "\n")
	require.Contains(t, notes, "Floor over HTTP ÷ River: 0.80 × — even with none of llmq's guarantees")
	require.Contains(t, notes, "out of reach of any such design here")
	require.Contains(t, notes, "Floor over HTTP ÷ the floor: 0.80 × — the two HTTP hops alone use up 20% of the floor's rate; "+
		"llmq ≥ 0.6 × the floor asks llmq for 75% of the floor over HTTP's rate.")
	require.Contains(t, notes, "llmq ÷ the floor over HTTP: 0.50 ×")

	rep.results[2] = res(tpHTTPFloor, 2400)
	notes = strings.Join(rep.notes(), "\n")
	require.Contains(t, notes, "Floor over HTTP ÷ River: 1.20 × — a queue that takes jobs and calls its provider over HTTP can reach River's rate here.")
}

func TestTPRateReport(t *testing.T) {
	t.Parallel()
	res := tpResult{id: tpLLMQ, name: "llmq", n: 3, lat: []time.Duration{ms(4), ms(6), ms(40)}, submit: []time.Duration{ms(2), ms(3), ms(4)}}
	floor := res
	floor.id, floor.name = tpHTTPFloor, systemName(tpHTTPFloor)
	rep := tpRateReport{opts: tpOpts{rates: []float64{500}}, runs: []tpRateRun{{rate: 500, res: floor}, {rate: 500, res: res}}}
	require.Equal(t, []string{"p99 40.0 ms > 30.0 ms"}, rateMisses(res))
	require.Equal(t, "—", rep.rows()[0][len(tpRateHeader)-1], "the targets are llmq's")
	require.Equal(t, "FAIL", rep.rows()[1][len(tpRateHeader)-1])
	notes := strings.Join(rep.notes(), "\n")
	require.Contains(t, notes, "llmq at 500/s: the largest delay of a submit behind its schedule was 0.0 ms; missed: p99 40.0 ms > 30.0 ms")
	require.NotContains(t, notes, "update at 500/s: the largest delay of a submit behind its schedule was 0.0 ms; missed", "no target for a floor")
	rep.runs[1].res.toStart = []time.Duration{ms(3), ms(3), ms(30)}
	rep.runs[1].res.fromStart = []time.Duration{ms(1), ms(3), ms(10)}
	require.Contains(t, strings.Join(rep.notes(), "\n"), "; created → first attempt started p50 3.0 ms, p99 30.0 ms; started → finished p50 3.0 ms, p99 10.0 ms")
	rep.runs[1].res.allLat = [][2]time.Duration{{ms(4), ms(40)}, {ms(6), ms(60)}}
	require.Contains(t, strings.Join(rep.notes(), "\n"),
		"; the run with the median p50 of 2 is shown, p50 / p99 of each in the order run: 4.0 ms / 40.0 ms, 6.0 ms / 60.0 ms.")
	res.lat[2] = ms(7)
	require.Empty(t, rateMisses(res))
}

// Rate mode keeps, of several runs, the one with the median p50, and every run's p50 and p99.
func TestMedianLatencyRun(t *testing.T) {
	t.Parallel()
	run := func(p50, p99 int) tpResult {
		return tpResult{lat: []time.Duration{ms(p50), ms(p50), ms(p99)}}
	}
	got := medianLatencyRun([]tpResult{run(30, 90), run(10, 200), run(20, 50)})
	require.Equal(t, ms(20), percentile(got.lat, 50), "the median p50, not the median p99's run")
	require.Equal(t, [][2]time.Duration{{ms(30), ms(90)}, {ms(10), ms(200)}, {ms(20), ms(50)}}, got.allLat, "in the order run")
	require.Nil(t, medianLatencyRun([]tpResult{run(5, 9)}).allLat, "one run: nothing to list")
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
	rows := tpBacklogReport{slices: sl}.sliceRows()
	require.Equal(t, []string{"1.00", "2.00", "—"}, rows[0][5:])
	require.Equal(t, []string{"2.00", "—", "—"}, rows[1][5:])
}

func TestTPBacklogReport(t *testing.T) {
	t.Parallel()
	// Judged on each backlog's whole drain rate, the small one's being the median of its drains.
	rep := tpBacklogReport{n: 100000, small: 1400, overall: 1300, smallAll: []float64{1400, 1100, 1500}}
	require.True(t, rep.ok(), "1300 ≥ 0.9 × 1400")
	row := rep.rows()[0]
	require.Equal(t, len(tpBacklogHeader), len(row))
	require.Equal(t, []string{"1300", "1400", "0.93", "PASS"}, row[6:])
	require.Contains(t, strings.Join(rep.notes(), "\n"), "Backlog of 1,000, jobs/s of each drain: 1400, 1100, 1500.")
	require.Equal(t, 850.0, median([]float64{1000, 700}))
	require.Zero(t, median(nil))
	rep.overall = 1190
	require.False(t, rep.ok(), "1190 < 0.9 × 1400")
	require.Equal(t, []string{"0.85", "FAIL"}, rep.rows()[0][8:10])
	require.False(t, tpBacklogReport{overall: 950}.ok(), "no comparison drain, no pass")
	require.Equal(t, "—", tpBacklogReport{overall: 950}.rows()[0][8])
	require.Equal(t, "100,000", thousandsText(100000))
	require.Equal(t, "999", thousandsText(999))
	require.Equal(t, "1,000", thousandsText(1000))
}

func TestLoadAverage(t *testing.T) {
	t.Parallel()
	require.Equal(t, "6.88, 7.94, 8.22", loadAverage("6.88 7.94 8.22 3/412 12345\n"))
	require.Empty(t, loadAverage(""))
	h := tpHead{command: "go run . throughput", date: time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC), machine: "m", load: "1.00, 2.00, 3.00"}
	require.Equal(t, "`go run . throughput` — 2026-11-29, m; load average 1.00, 2.00, 3.00 when it started "+
		"(other work on the machine slows every row).\n\n", h.markdownLine())
}

func TestMsText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "4.2 ms", msText(4200*time.Microsecond))
	require.Equal(t, "153 ms", msText(153*time.Millisecond))
	require.Equal(t, "12.50 s", msText(12500*time.Millisecond))
}

func TestThroughputSection(t *testing.T) {
	t.Parallel()
	t.Run("NewSectionHasEveryPart", func(t *testing.T) {
		t.Parallel()
		s, err := throughputSection("", tpPartRate, "RATE\n")
		require.NoError(t, err)
		require.Contains(t, s, "## throughput")
		for _, p := range tpParts {
			b, e := tpPartMarkers(p)
			require.Contains(t, s, b)
			require.Contains(t, s, e)
		}
		b, e := tpPartMarkers(tpPartRate)
		require.Contains(t, s, b+"\nRATE\n"+e)
	})
	t.Run("OtherPartsKept", func(t *testing.T) {
		t.Parallel()
		s, err := throughputSection("", tpPartTable, "TABLE v1\n")
		require.NoError(t, err)
		s, err = throughputSection(s, tpPartBacklog, "BACKLOG\n")
		require.NoError(t, err)
		s, err = throughputSection(s, tpPartTable, "TABLE v2\n")
		require.NoError(t, err)
		require.Contains(t, s, "TABLE v2")
		require.NotContains(t, s, "TABLE v1")
		require.Contains(t, s, "BACKLOG")
	})
	t.Run("FileKeepsOtherSections", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "benchmarks.md")
		doc := "# Benchmarks\n\n" + herdBegin + "\nHERD\n" + herdEnd + "\n"
		require.NoError(t, os.WriteFile(path, []byte(doc), 0o644))
		require.NoError(t, writeThroughputPart(path, tpPartTable, "T1\n"))
		require.NoError(t, writeThroughputPart(path, tpPartBacklog, "B1\n"))
		require.NoError(t, writeThroughputPart(path, tpPartTable, "T2\n"))
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		s := string(got)
		require.Contains(t, s, herdBegin+"\nHERD\n"+herdEnd)
		require.Contains(t, s, "T2")
		require.NotContains(t, s, "T1")
		require.Contains(t, s, "B1")
		require.Equal(t, 1, strings.Count(s, tpBegin))
		require.Equal(t, 1, strings.Count(s, "## throughput"))
	})
	t.Run("UnclosedSection", func(t *testing.T) {
		t.Parallel()
		_, err := sectionBody("x "+tpBegin+" y", tpBegin, tpEnd)
		require.ErrorIs(t, err, errNoEndMarker)
	})
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
