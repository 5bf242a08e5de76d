package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// rate is `bench rate`: each system at fixed offered rates for a while (an open loop: job k is
// submitted at k/rate whatever the answers). The targets, for each llmq layout at every rate:
// submit → result p50 ≤ 8 ms and p99 ≤ 20 ms, the submit call's p99 ≤ 20 ms, and CPU per job
// (every process and server counted) at most 1.2 × the floor over HTTP's at the same rate.
type rate struct {
	o        tpOpts
	rates    []float64
	duration time.Duration
	runs     []rateRun
	// baseBin is the directory of another build's binaries (-baseline-bin; empty: none);
	// compared holds its runs paired with this build's, per llmq layout and rate.
	baseBin  string
	compared []buildComparison
}

// rateRun is the median run of one system at one rate, with the p50 and p99 of every run.
type rateRun struct {
	rate float64
	res  tpResult
	each [][2]time.Duration
}

// The rate targets.
const (
	tpTargetRateP50  = 8 * time.Millisecond
	tpTargetRateP99  = 20 * time.Millisecond
	tpTargetSubmit99 = 20 * time.Millisecond
	tpTargetRateCPU  = 1.2 // CPU per job ≤ 1.2 × the floor over HTTP's
)

func (r *rate) flags(fs *flagSet, s *shared) {
	r.o.flags(fs, s, true)
	s.repeat(fs, 3)
	s.deadline(fs, 3*time.Minute, "cap on each run's wait for its jobs, from its first submit")
	fs.StringVar(&s.only, "only", "httpfloor,llmq,serve", "comma-separated systems to run: "+strings.Join(tpIDs(), ", "))
	fs.Func("rate", "offered jobs per second, comma-separated: one row each (default 100,500)", func(v string) (err error) {
		r.rates, err = parseRates(v)
		return err
	})
	r.rates = []float64{100, 500}
	fs.positiveDuration(&r.duration, "duration", 10*time.Second, "how long jobs are offered at each rate")
	baselineFlag(fs, &r.baseBin)
}

// parseRates parses "100,500" into positive rates.
func parseRates(s string) ([]float64, error) {
	var out []float64
	for f := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("%q is not a positive number of jobs per second", strings.TrimSpace(f))
		}
		out = append(out, v)
	}
	return out, nil
}

func (r *rate) run(ctx context.Context, log logf) error {
	ids, err := selectIDs(tpIDs(), r.o.only)
	if err != nil {
		return err
	}
	if err := r.o.binariesFor(ctx, ids, log); err != nil {
		return err
	}
	for _, rt := range r.rates {
		n := max(1, int(rt*r.duration.Seconds()))
		runs, baseRuns := make([][]tpResult, len(ids)), make([][]tpResult, len(ids))
		one := func(k int, id string, o tpOpts) tpResult {
			side := ""
			if o.shared != r.o.shared { // the baseline's side (see runBaseline)
				side = baselineSuffix
			}
			log("[%d/%d] %s%s at %g jobs/s for %s (%d jobs)", k+1, r.o.runs, systemName(id), side, rt, r.duration, n)
			var ol openLoopStats
			res := measure(ctx, o, newSystem(o, id, log), id, n, openLoop(rt, &ol), log)
			res.lag, res.offered = ol.lag, ol.spread
			if res.err == nil {
				log("  p50 %s, p99 %s, submit p99 %s", msText(percentile(res.lat, 50)), msText(percentile(res.lat, 99)),
					msText(percentile(res.submit, 99)))
			}
			return res
		}
		for k := range r.o.runs {
			for i, id := range ids { // interleaved, so that a change in the machine's load hits every system
				if ctx.Err() != nil {
					return nil
				}
				if !comparing(r.baseBin, id) {
					runs[i] = append(runs[i], one(k, id, r.o))
					continue
				}
				this, base := pairRuns(k, func() tpResult { return one(k, id, r.o) },
					func() tpResult {
						return runBaseline(r.baseBin, r.o, func(o tpOpts) tpResult { return one(k, id, o) })
					})
				runs[i], baseRuns[i] = append(runs[i], this), append(baseRuns[i], base)
			}
		}
		for i, id := range ids {
			r.runs = append(r.runs, medianLatency(rt, runs[i]))
			if len(baseRuns[i]) == 0 {
				continue
			}
			r.runs = append(r.runs, medianLatency(rt, baseRuns[i]))
			r.compared = append(r.compared, newComparison(systemName(id), rt, rateMeasures, runs[i], baseRuns[i]))
		}
	}
	return nil
}

// medianLatency keeps, of the runs of one system at one rate, the one with the median
// submit → result p50, and the p50 and p99 of each.
func medianLatency(rt float64, runs []tpResult) rateRun {
	run := rateRun{rate: rt, res: medianBy(runs, func(r tpResult) float64 { return float64(percentile(r.lat, 50)) })}
	for _, r := range runs {
		if r.err == nil {
			run.each = append(run.each, [2]time.Duration{percentile(r.lat, 50), percentile(r.lat, 99)})
		}
	}
	return run
}

// checks judges an llmq run against the rate targets; floor is the floor over HTTP's run at the
// same rate (nil: CPU is not judged).
func (run rateRun) checks(floor *rateRun) []check {
	res := run.res
	if res.err != nil {
		return []check{{what: "run", got: "failed", target: "done"}}
	}
	ms := func(what string, got, target time.Duration) check {
		return check{what: what, got: msText(got), target: "≤ " + msText(target), pass: got <= target}
	}
	cs := []check{
		ms("p50", percentile(res.lat, 50), tpTargetRateP50),
		ms("p99", percentile(res.lat, 99), tpTargetRateP99),
		ms("submit p99", percentile(res.submit, 99), tpTargetSubmit99),
	}
	if floor != nil && floor.res.err == nil {
		if mine, theirs := res.cpuTotalPer1000(), floor.res.cpuTotalPer1000(); theirs > 0 {
			v := mine / theirs
			cs = append(cs, check{what: "CPU per job ÷ floor over HTTP's", got: fmt.Sprintf("%.2f", v),
				target: fmt.Sprintf("≤ %.1f", tpTargetRateCPU), pass: v <= tpTargetRateCPU})
		}
	}
	return cs
}

// floorAt is the floor over HTTP's run at rate, or nil.
func (r *rate) floorAt(rate float64) *rateRun {
	for i := range r.runs {
		if r.runs[i].res.id == tpHTTPFloor && r.runs[i].rate == rate {
			return &r.runs[i]
		}
	}
	return nil
}

// rateHeader is the header of the rate table.
var rateHeader = []string{"system", "offered", "achieved", "jobs", "submit→result p50", "p90", "p99", "max",
	"submit call p50", "p99", "max", "CPU s/1k jobs: bench", "api", "workers", "postgres", "redis", "target"}

func (r *rate) report() report {
	var rep report
	var rows [][]string
	for _, run := range r.runs {
		res := run.res
		target := "—" // the targets are llmq's; the floors show what the machine allows
		if (res.id == tpLLMQ || res.id == tpServe) && !res.baseline {
			target = verdict(run.checks(r.floorAt(run.rate)))
		}
		if res.err != nil {
			rows = append(rows, append([]string{res.name, fmt.Sprintf("%g/s", run.rate), "error"}, make([]string, len(rateHeader)-3)...))
			rep.failed = append(rep.failed, fmt.Sprintf("%s%s at %g/s", res.id, res.side(), run.rate))
			continue
		}
		achieved := "—"
		if res.offered > 0 {
			achieved = fmt.Sprintf("%.0f/s", float64(res.n-1)/res.offered.Seconds())
		}
		row := []string{res.name, fmt.Sprintf("%g/s", run.rate), achieved, fmt.Sprint(res.n),
			msText(percentile(res.lat, 50)), msText(percentile(res.lat, 90)), msText(percentile(res.lat, 99)), msText(percentile(res.lat, 100)),
			msText(percentile(res.submit, 50)), msText(percentile(res.submit, 99)), msText(percentile(res.submit, 100))}
		rows = append(rows, append(append(row, cpuCells(res)...), target))
	}
	rep.tables = []table{{rateHeader, rows}}
	rep.notes = []string{fmt.Sprintf("%s at each offered rate after %d warm-up jobs, a fresh system for each run, the runs "+
		"interleaved; llmq with %d workers. Targets (llmq): submit→result p50 ≤ %s, p99 ≤ %s; submit call p99 ≤ %s; "+
		"CPU per job (every column) ≤ %.1f × the floor over HTTP's at the same rate.",
		r.duration, r.o.warmup, r.o.workers, msText(tpTargetRateP50), msText(tpTargetRateP99), msText(tpTargetSubmit99), tpTargetRateCPU)}
	rep.notes = append(rep.notes, gomaxprocsNote(r.o.gomaxprocs)...)
	for _, run := range r.runs {
		rep.notes = append(rep.notes, run.note()...)
	}
	for _, c := range r.compared {
		if s := c.note(); s != "" {
			rep.notes = append(rep.notes, s)
		}
	}
	return rep
}

// note describes a run beyond its row: how late the submits were, where llmq's latency went,
// and the p50 / p99 of every run.
func (run rateRun) note() []string {
	res := run.res
	if res.err != nil {
		return runNotes(res)
	}
	parts := []string{"submits up to " + msText(res.lag) + " late"}
	if len(res.toStart) > 0 {
		parts = append(parts, fmt.Sprintf("created → first attempt started p50 %s, p99 %s; started → finished p50 %s, p99 %s",
			msText(percentile(res.toStart, 50)), msText(percentile(res.toStart, 99)),
			msText(percentile(res.fromStart, 50)), msText(percentile(res.fromStart, 99))))
	}
	if s := stagesLine(res.stages, res.n); s != "" {
		parts = append(parts, s)
	}
	if s := systemNote(res); s != "" {
		parts = append(parts, s)
	}
	if s := walNote(res); s != "" {
		parts = append(parts, s)
	}
	if len(run.each) > 1 {
		each := make([]string, len(run.each))
		for i, l := range run.each {
			each[i] = msText(l[0]) + " / " + msText(l[1])
		}
		parts = append(parts, "p50 / p99 of each run: "+strings.Join(each, ", "))
	}
	notes := []string{fmt.Sprintf("%s at %g/s: %s.", res.name, run.rate, strings.Join(parts, "; "))}
	if s := statusesNote(res.name, res.statuses); s != "" {
		notes = append(notes, s)
	}
	return notes
}
