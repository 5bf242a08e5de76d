package main

import (
	"context"
	"fmt"
	"runtime/debug"
	"strings"
	"time"
)

// throughput is `bench throughput`: n jobs through each system as fast as it goes, from a
// closed loop of clients, the systems' runs interleaved. The throughput targets, for each of
// llmq's layouts (an api and workers; serve processes): at least 0.9 × the rate of the floor
// over HTTP, and 1.0 × River over HTTP's.
type throughput struct {
	o       tpOpts
	results []tpResult // the median run of each system (then of each baseline build's layout)
	rates   [][]float64
	// baseBin is the directory of another build's binaries (-baseline-bin; empty: none);
	// compared holds its runs paired with this build's, per llmq layout.
	baseBin  string
	compared []buildComparison
}

// The throughput targets.
const (
	tpTargetVsHTTPFloor = 0.9 // llmq jobs/s ≥ 0.9 × the floor over HTTP's
	tpTargetVsRiverHTTP = 1.0 // llmq jobs/s ≥ 1.0 × River over HTTP's
)

func (t *throughput) flags(fs *flagSet, s *shared) {
	t.o.flags(fs, s, true)
	s.jobs(fs, 5000, "jobs per system")
	s.repeat(fs, 3)
	s.deadline(fs, 3*time.Minute, "cap on each run's wait for its jobs, from its first submit")
	s.rows(fs, tpIDs())
	baselineFlag(fs, &t.baseBin)
}

func (t *throughput) run(ctx context.Context, log logf) error {
	ids, err := selectIDs(tpIDs(), t.o.only)
	if err != nil {
		return err
	}
	if err := t.o.binariesFor(ctx, ids, log); err != nil {
		return err
	}
	log("%d jobs per system, %d clients, %d runs, instant provider", t.o.n, t.o.clients, t.o.runs)
	runs, baseRuns := make([][]tpResult, len(ids)), make([][]tpResult, len(ids))
	one := func(i, r int, id string, o tpOpts) tpResult {
		name := systemName(id)
		if o.shared != t.o.shared { // the baseline's side (see runBaseline)
			name += baselineSuffix
		}
		log("[%d/%d] %s: run %d/%d", i+1, len(ids), name, r+1, t.o.runs)
		res := measure(ctx, o, newSystem(o, id, log), id, t.o.n, closedLoop(t.o.clients), log)
		if res.err != nil {
			log("[%d/%d] %s: error: %v", i+1, len(ids), name, res.err)
		} else {
			log("[%d/%d] %s: %.0f jobs/s, p50 %s, p99 %s", i+1, len(ids), name, res.jobsPerSecond(),
				msText(percentile(res.lat, 50)), msText(percentile(res.lat, 99)))
		}
		return res
	}
	for r := range t.o.runs {
		for i, id := range ids { // interleaved, so that a change in the machine's load hits every system
			if ctx.Err() != nil {
				return nil
			}
			if !comparing(t.baseBin, id) {
				runs[i] = append(runs[i], one(i, r, id, t.o))
				continue
			}
			this, base := pairRuns(r, func() tpResult { return one(i, r, id, t.o) },
				func() tpResult {
					return runBaseline(t.baseBin, t.o, func(o tpOpts) tpResult { return one(i, r, id, o) })
				})
			runs[i], baseRuns[i] = append(runs[i], this), append(baseRuns[i], base)
		}
	}
	add := func(rs []tpResult) {
		t.results = append(t.results, medianBy(rs, tpResult.jobsPerSecond))
		var rates []float64
		for _, res := range rs {
			if res.err == nil {
				rates = append(rates, res.jobsPerSecond())
			}
		}
		t.rates = append(t.rates, rates)
	}
	for i := range ids {
		add(runs[i])
	}
	for i, id := range ids {
		if len(baseRuns[i]) == 0 {
			continue
		}
		add(baseRuns[i])
		t.compared = append(t.compared, newComparison(systemName(id), 0, throughputMeasures, runs[i], baseRuns[i]))
	}
	return nil
}

// rate is the system's jobs/s; ok is false when it did not run or has no figure.
func (t *throughput) rate(id string) (float64, bool) {
	for _, r := range t.results {
		if r.id == id && !r.baseline && r.jobsPerSecond() > 0 {
			return r.jobsPerSecond(), true
		}
	}
	return 0, false
}

// ratio is system a's jobs/s over system b's; ok is false when either did not run.
func (t *throughput) ratio(a, b string) (float64, bool) {
	ra, oka := t.rate(a)
	rb, okb := t.rate(b)
	return ra / rb, oka && okb
}

// tpHeader is the header of the throughput table.
var tpHeader = []string{"system", "jobs", "jobs/s", "submit→result p50", "p99", "submit call p50", "p99",
	"CPU s/1k jobs: bench", "api", "workers", "postgres", "redis", "llmq ÷ this"}

func (t *throughput) report() report {
	var rows [][]string
	var rep report
	for _, r := range t.results {
		if r.err != nil {
			rows = append(rows, append([]string{r.name, "error"}, make([]string, len(tpHeader)-2)...))
			rep.failed = append(rep.failed, r.id+r.side())
			continue
		}
		ratio := "—"
		if v, ok := t.ratio(tpLLMQ, r.id); ok && r.id != tpLLMQ && !r.baseline {
			ratio = fmt.Sprintf("%.2f", v)
		}
		row := []string{r.name, fmt.Sprint(r.n), fmt.Sprintf("%.0f", r.jobsPerSecond()), msText(percentile(r.lat, 50)),
			msText(percentile(r.lat, 99)), msText(percentile(r.submit, 50)), msText(percentile(r.submit, 99))}
		rows = append(rows, append(append(row, cpuCells(r)...), ratio))
	}
	o := t.o
	rep.tables = []table{{tpHeader, rows}}
	rep.notes = []string{fmt.Sprintf("%d jobs per system after %d warm-up jobs, from %d clients one job per call; jobs/s = jobs ÷ "+
		"(first submit → last result). Concurrency %d (asynq's Concurrency, River's MaxWorkers, llmq's %d workers × 200); the "+
		"in-process queues' pools %d connections; River %s. CPU in seconds per 1,000 jobs.",
		o.n, o.warmup, o.clients, o.concurrency(), o.workers, o.conns, riverVersion())}
	rep.notes = append(rep.notes, gomaxprocsNote(o.gomaxprocs)...)
	var cs []check
	for _, layout := range []string{tpLLMQ, tpServe} {
		for _, c := range []struct {
			id     string
			target float64
		}{{tpHTTPFloor, tpTargetVsHTTPFloor}, {tpRiverHTTP, tpTargetVsRiverHTTP}} {
			if v, ok := t.ratio(layout, c.id); ok {
				cs = append(cs, check{what: shortName(layout) + " ÷ " + shortName(c.id), got: fmt.Sprintf("%.2f", v),
					target: fmt.Sprintf("≥ %.1f", c.target), pass: v >= c.target})
			}
		}
	}
	if len(cs) > 0 {
		rep.notes = append(rep.notes, checksNote("Throughput targets", cs))
	}
	var reach []string
	for _, p := range [][2]string{{tpHTTPFloor, tpRiver}, {tpHTTPFloor, tpComposite}, {tpLLMQ, tpHTTPFloor}, {tpServe, tpLLMQ}} {
		if v, ok := t.ratio(p[0], p[1]); ok {
			reach = append(reach, fmt.Sprintf("%s ÷ %s %.2f", shortName(p[0]), shortName(p[1]), v))
		}
	}
	if len(reach) > 0 {
		rep.notes = append(rep.notes, "What the floor over HTTP leaves: "+strings.Join(reach, ", ")+".")
	}
	var each []string
	for i, r := range t.results {
		if len(t.rates[i]) > 1 {
			each = append(each, fmt.Sprintf("%s%s %s", shortName(r.id), r.side(), joinFloats(t.rates[i])))
		}
	}
	if len(each) > 0 {
		rep.notes = append(rep.notes, "The median run is shown; jobs/s of each run: "+strings.Join(each, "; ")+".")
	}
	for _, r := range t.results {
		rep.notes = append(rep.notes, runNotes(r)...)
	}
	for _, c := range t.compared {
		if s := c.note(); s != "" {
			rep.notes = append(rep.notes, s)
		}
	}
	return rep
}

// runNotes are the notes of one measured run: its failure, the statuses other than succeeded,
// and the workers' stages.
func runNotes(r tpResult) []string {
	if r.err != nil {
		return []string{fmt.Sprintf("%s: failed: %s", r.name, firstLine(r.err))}
	}
	var notes []string
	if s := statusesNote(r.name, r.statuses); s != "" {
		notes = append(notes, s)
	}
	if s := stagesLine(r.stages, r.n); s != "" {
		notes = append(notes, r.name+": "+s+".")
	}
	if s := systemNote(r); s != "" {
		notes = append(notes, r.name+": "+s+".")
	}
	if s := walNote(r); s != "" {
		notes = append(notes, r.name+": "+s+".")
	}
	return notes
}

// joinFloats renders vs rounded, comma-separated.
func joinFloats(vs []float64) string { return joinFormatted("%.0f", vs) }

// joinFormatted renders each of vs with format, comma-separated.
func joinFormatted(format string, vs []float64) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprintf(format, v)
	}
	return strings.Join(out, ", ")
}

// riverVersion is the River module this binary was built with.
func riverVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/riverqueue/river" {
				return d.Version
			}
		}
	}
	return "(version unknown)"
}
