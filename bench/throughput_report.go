package main

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"
)

// tpHead is what every part of the throughput section starts with: the command and where it ran.
type tpHead struct {
	command string
	date    time.Time
	machine string
	load    string // the load average when the run started ("" when unknown)
}

func (h tpHead) markdownLine() string {
	load := ""
	if h.load != "" {
		load = "; load average " + h.load + " when it started (other work on the machine slows every row)"
	}
	return fmt.Sprintf("`%s` — %s, %s%s.\n\n", h.command, h.date.Format("2006-01-02"), h.machine, load)
}

// loadAverage returns the 1, 5 and 15 minute load averages from the text of /proc/loadavg, or "".
func loadAverage(procLoadavg string) string {
	f := strings.Fields(procLoadavg)
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], ", ")
}

// The throughput targets: llmq's rate against the floor and River, its latency at a fixed
// rate, and the backlog's drain rate against a small backlog's.
const (
	tpTargetVsFloor  = 0.6 // llmq jobs/s ≥ 0.6 × the composite floor's
	tpTargetVsRiver  = 1.0 // llmq jobs/s ≥ 1.0 × River's
	tpTargetRateP50  = 10 * time.Millisecond
	tpTargetRateP99  = 30 * time.Millisecond
	tpTargetSubmit99 = 20 * time.Millisecond
	tpTargetBacklog  = 0.10 // drain rate of the full backlog within 10% of a small backlog's
)

// msText renders a latency: "4.2 ms", "153 ms", "2.31 s".
func msText(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 100:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 10000:
		return fmt.Sprintf("%.0f ms", ms)
	}
	return seconds(d)
}

// passText is PASS or FAIL.
func passText(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// tpReport is a finished throughput-mode run.
type tpReport struct {
	tpHead
	opts    tpOpts
	results []tpResult
}

var tpHeader = []string{"system", "jobs", "jobs/s", "submit→result p50", "p99", "submit call p50", "p99",
	"CPU s/1k jobs: bench", "api", "workers", "postgres", "redis", "llmq ÷ this"}

// llmq returns the llmq result, if it ran without error.
func (r tpReport) llmq() (tpResult, bool) {
	for _, res := range r.results {
		if res.id == tpLLMQ && res.err == nil {
			return res, true
		}
	}
	return tpResult{}, false
}

// ratio is llmq's jobs/s over the system's; ok is false when either did not run.
func (r tpReport) ratio(id string) (float64, bool) {
	return r.between(tpLLMQ, id)
}

// between is system a's jobs/s over system b's; ok is false when either did not run.
func (r tpReport) between(a, b string) (float64, bool) {
	ra, oka := r.rate(a)
	rb, okb := r.rate(b)
	if !oka || !okb {
		return 0, false
	}
	return ra / rb, true
}

// rate is the system's jobs/s; ok is false when it did not run or has no figure.
func (r tpReport) rate(id string) (float64, bool) {
	for _, res := range r.results {
		if res.id == id && res.err == nil && res.jobsPerSecond() > 0 {
			return res.jobsPerSecond(), true
		}
	}
	return 0, false
}

func cpuCells(res tpResult) []string {
	out := make([]string, len(cpuGroups))
	for i, g := range cpuGroups {
		if v, ok := res.cpuPer1000(g); ok {
			out[i] = fmt.Sprintf("%.2f", v)
		} else {
			out[i] = "—"
		}
	}
	return out
}

func (r tpReport) rows() [][]string {
	var out [][]string
	for _, res := range r.results {
		if res.err != nil {
			out = append(out, []string{res.name, "error", "", "", "", "", "", "", "", "", "", "", ""})
			continue
		}
		ratio := "—"
		if res.id != tpLLMQ {
			if v, ok := r.ratio(res.id); ok {
				ratio = fmt.Sprintf("%.2f", v)
			}
		}
		row := []string{res.name, fmt.Sprint(res.n), fmt.Sprintf("%.0f", res.jobsPerSecond()),
			msText(percentile(res.lat, 50)), msText(percentile(res.lat, 99)),
			msText(percentile(res.submit, 50)), msText(percentile(res.submit, 99))}
		row = append(row, cpuCells(res)...)
		out = append(out, append(row, ratio))
	}
	return out
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

func (r tpReport) notes() []string {
	o := r.opts
	notes := []string{
		fmt.Sprintf("Each system runs %d jobs after %d warm-up jobs (not counted), submitted by %d concurrent clients one job per call "+
			"(no batching). jobs/s = jobs ÷ (first submit → last result). The provider is llmsim in this process with no limit and no "+
			"latency; llmq's credential has no limits configured, so its limiter learns that the provider sends no rate-limit headers "+
			"and then admits at once.", o.n, o.warmup, o.clients),
		fmt.Sprintf("asynq: one process, Concurrency %d, TaskCheckInterval 10 ms (as llmq's worker); result = the handler returned.", o.concurrency()),
		fmt.Sprintf("River %s (riverpgxv5, schema by rivermigrate on a fresh database): one process, pool of %d, MaxWorkers %d, "+
			"FetchCooldown %s, FetchPollInterval %s; jobs inserted one by one with Client.Insert; result = Work returned "+
			"(River marks jobs completed in batches afterwards).", riverVersion(), o.conns, o.concurrency(), riverFetchCooldown, riverFetchPoll),
		fmt.Sprintf("Floor: one process, pool of %d: INSERT of a row holding the request (jsonb), then asynq enqueue with TaskID = row id; "+
			"the handler UPDATEs the row to done if it is still queued; result = the UPDATE committed. asynq as above.", o.conns),
		fmt.Sprintf("Floor over HTTP: the floor with llmq's two HTTP hops and none of its guarantees, all in one process (clients and "+
			"simulator too), pool of %d: clients POST {i, request} over keep-alive HTTP to an API that INSERTs the row and enqueues "+
			"a task carrying the request (TaskID = row id) before it answers 202; the handler POSTs the request to the same instant "+
			"llmsim and UPDATEs the row with the answer if it is still queued; result = the UPDATE committed. No idempotency, "+
			"limiter, breaker, lease, attempt record or event, and no hand-off between processes: a lower bound for any queue "+
			"that takes jobs and calls its provider over HTTP.", o.conns),
		fmt.Sprintf("llmq: bin/api + %d bin/worker processes with the default config (worker concurrency 200, pgx pools of 16 connections, "+
			"llmq's default); jobs POSTed to /v1/jobs over keep-alive HTTP; result = the job row's finished_at, latency = "+
			"created_at → finished_at from the jobs table; completion observed with a COUNT of unfinished jobs every %s "+
			"(or 10 × the COUNT's own time, when longer), never per-job GETs.", o.workers, llmqPollEvery),
		"CPU: seconds per 1,000 jobs. bench = this process (getrusage): for asynq, River and the floor that is the whole queue, " +
			"producers and workers; for llmq the HTTP clients, the simulator and the observer. api and workers: /proc/<pid>/stat. " +
			"postgres: the backends connected to the run's database (pids from pg_stat_activity, CPU from /proc). redis: INFO cpu " +
			"of the whole server, shared with anything else using it at the time.",
	}
	if v, ok := r.ratio(tpComposite); ok {
		notes = append(notes, fmt.Sprintf("Target llmq ≥ %.1f × the floor: %.2f × — %s.", tpTargetVsFloor, v, passText(v >= tpTargetVsFloor)))
	}
	if v, ok := r.ratio(tpRiver); ok {
		notes = append(notes, fmt.Sprintf("Target llmq ≥ %.1f × River: %.2f × — %s.", tpTargetVsRiver, v, passText(v >= tpTargetVsRiver)))
	}
	notes = append(notes, r.reachNotes()...)
	for _, res := range r.results {
		if len(res.allRates) > 1 {
			rates := make([]string, len(res.allRates))
			for i, v := range res.allRates {
				rates[i] = fmt.Sprintf("%.0f", v)
			}
			notes = append(notes, fmt.Sprintf("%s: median of %d runs shown; jobs/s of each: %s.", res.name, len(res.allRates), strings.Join(rates, ", ")))
		}
		if s := statusesNote(res); s != "" {
			notes = append(notes, s)
		}
		if sl := stagesLine(res.stages, res.n); sl != "" {
			notes = append(notes, res.name+" (the run shown): "+sl+".")
		}
		if res.err != nil {
			first, _, _ := strings.Cut(res.err.Error(), "\n")
			notes = append(notes, fmt.Sprintf("%s: failed: %s", res.name, first))
		}
	}
	return notes
}

// reachNotes say what the floor over HTTP shows of the targets: how much of each the two HTTP
// hops alone use up, and how much of the floor over HTTP llmq's own work leaves.
func (r tpReport) reachNotes() []string {
	var out []string
	if v, ok := r.between(tpHTTPFloor, tpRiver); ok {
		reach := "a queue that takes jobs and calls its provider over HTTP can reach River's rate here"
		if v < tpTargetVsRiver {
			reach = fmt.Sprintf("even with none of llmq's guarantees and in one process, a queue that takes jobs and calls its "+
				"provider over HTTP reaches only %.2f × River's rate on this machine, so the River target is out of reach "+
				"of any such design here", v)
		}
		out = append(out, fmt.Sprintf("Floor over HTTP ÷ River: %.2f × — %s.", v, reach))
	}
	if v, ok := r.between(tpHTTPFloor, tpComposite); ok {
		out = append(out, fmt.Sprintf("Floor over HTTP ÷ the floor: %.2f × — the two HTTP hops alone use up %.0f%% of the floor's rate; "+
			"llmq ≥ %.1f × the floor asks llmq for %.0f%% of the floor over HTTP's rate.", v, 100*(1-v), tpTargetVsFloor, 100*tpTargetVsFloor/v))
	}
	if v, ok := r.ratio(tpHTTPFloor); ok {
		out = append(out, fmt.Sprintf("llmq ÷ the floor over HTTP: %.2f × — what llmq's guarantees (idempotency, shared limiter and "+
			"breaker, attempt lease and record, events) and its separate api and worker processes leave of the least an "+
			"HTTP-to-HTTP queue must do.", v))
	}
	return out
}

// statusesNote names final statuses other than succeeded, or "".
func statusesNote(res tpResult) string {
	var other []string
	for s, c := range res.statuses {
		if s != "succeeded" {
			other = append(other, fmt.Sprintf("%d %s", c, s))
		}
	}
	if len(other) == 0 {
		return ""
	}
	return fmt.Sprintf("%s: not every job succeeded: %s.", res.name, strings.Join(other, ", "))
}

func (r tpReport) text() string {
	return sectionText(tpHeader, r.rows(), r.notes())
}

func (r tpReport) markdown() string {
	return "### Throughput: as fast as each queue goes\n\n" + r.markdownLine() + markdownTable(tpHeader, r.rows()) + "\n" + bullets(r.notes())
}

// tpRateRun is llmq at one offered rate.
type tpRateRun struct {
	rate float64
	res  tpResult
}

// tpRateReport is a finished rate-mode run.
type tpRateReport struct {
	tpHead
	opts tpOpts
	runs []tpRateRun
}

var tpRateHeader = []string{"system", "offered", "achieved", "jobs", "submit→result p50", "p90", "p99", "max",
	"submit call p50", "p99", "max", "CPU s/1k jobs: bench", "api", "workers", "postgres", "redis", "target"}

// rateMisses returns the rate targets the run missed.
func rateMisses(res tpResult) []string {
	if res.err != nil {
		return []string{"the run failed"}
	}
	var out []string
	if p := percentile(res.lat, 50); p > tpTargetRateP50 {
		out = append(out, fmt.Sprintf("p50 %s > %s", msText(p), msText(tpTargetRateP50)))
	}
	if p := percentile(res.lat, 99); p > tpTargetRateP99 {
		out = append(out, fmt.Sprintf("p99 %s > %s", msText(p), msText(tpTargetRateP99)))
	}
	if p := percentile(res.submit, 99); p > tpTargetSubmit99 {
		out = append(out, fmt.Sprintf("submit p99 %s > %s", msText(p), msText(tpTargetSubmit99)))
	}
	return out
}

func (r tpRateReport) rows() [][]string {
	var out [][]string
	for _, run := range r.runs {
		res := run.res
		if res.err != nil {
			out = append(out, []string{res.name, fmt.Sprintf("%g/s", run.rate), "error"})
			continue
		}
		achieved := "—"
		if res.offered > 0 {
			achieved = fmt.Sprintf("%.0f/s", float64(res.n-1)/res.offered.Seconds())
		}
		row := []string{res.name, fmt.Sprintf("%g/s", run.rate), achieved, fmt.Sprint(res.n),
			msText(percentile(res.lat, 50)), msText(percentile(res.lat, 90)), msText(percentile(res.lat, 99)), msText(percentile(res.lat, 100)),
			msText(percentile(res.submit, 50)), msText(percentile(res.submit, 99)), msText(percentile(res.submit, 100))}
		row = append(row, cpuCells(res)...)
		target := "—" // the targets are llmq's; the floors show what the machine allows
		if res.id == tpLLMQ {
			target = passText(len(rateMisses(res)) == 0)
		}
		out = append(out, append(row, target))
	}
	return out
}

func (r tpRateReport) notes() []string {
	o := r.opts
	notes := []string{
		fmt.Sprintf("Each offered rate for %s (an open loop: job k is submitted at k/rate whatever the answers, each submit on its own "+
			"goroutine), after %d warm-up jobs, on a fresh system of each kind as in the throughput table (llmq: %d worker processes; "+
			"instant provider). llmq's submit→result = created_at → finished_at from the jobs table; the floors' = the submit call's "+
			"start → the result committed (they include the submit's own time). submit call = the submit as the client saw it. "+
			"Achieved = the rate at which submits went out.", o.duration, o.warmup, o.workers),
		fmt.Sprintf("Targets (llmq, at 500/s): submit→result p50 ≤ %s and p99 ≤ %s, submit call p99 ≤ %s. "+
			"The floors' rows, run in the same invocation, show what this machine allows at the same rate.",
			msText(tpTargetRateP50), msText(tpTargetRateP99), msText(tpTargetSubmit99)),
	}
	for _, run := range r.runs {
		res := run.res
		if res.err != nil {
			notes = append(notes, fmt.Sprintf("%s at %g/s: the run failed: %v", res.name, run.rate, res.err))
			continue
		}
		line := fmt.Sprintf("%s at %g/s: the largest delay of a submit behind its schedule was %s", res.name, run.rate, msText(res.lag))
		if m := rateMisses(res); res.id == tpLLMQ && len(m) > 0 {
			line += "; missed: " + strings.Join(m, "; ")
		}
		if len(res.toStart) > 0 {
			line += fmt.Sprintf("; created → first attempt started p50 %s, p99 %s; started → finished p50 %s, p99 %s",
				msText(percentile(res.toStart, 50)), msText(percentile(res.toStart, 99)),
				msText(percentile(res.fromStart, 50)), msText(percentile(res.fromStart, 99)))
		}
		if sl := stagesLine(res.stages, res.n); sl != "" {
			line += "; " + sl
		}
		if len(res.allLat) > 1 {
			each := make([]string, len(res.allLat))
			for i, l := range res.allLat {
				each[i] = msText(l[0]) + " / " + msText(l[1])
			}
			line += fmt.Sprintf("; the run with the median p50 of %d is shown, p50 / p99 of each in the order run: %s",
				len(res.allLat), strings.Join(each, ", "))
		}
		notes = append(notes, line+".")
		if s := statusesNote(res); s != "" {
			notes = append(notes, s)
		}
	}
	return notes
}

func (r tpRateReport) text() string {
	return sectionText(tpRateHeader, r.rows(), r.notes())
}

func (r tpRateReport) markdown() string {
	return "### Fixed rate: latency at a steady load\n\n" + r.markdownLine() + markdownTable(tpRateHeader, r.rows()) + "\n" + bullets(r.notes())
}

// Markers of the throughput section and of its parts in docs/benchmarks.md. Each mode rewrites
// its own part, so that one run does not erase the others' figures.
const (
	tpBegin       = "<!-- throughput:begin -->"
	tpEnd         = "<!-- throughput:end -->"
	tpPartTable   = "table"
	tpPartRate    = "rate"
	tpPartBacklog = "backlog"
)

var tpParts = []string{tpPartTable, tpPartRate, tpPartBacklog}

func tpPartMarkers(part string) (begin, end string) {
	return "<!-- throughput-" + part + ":begin -->", "<!-- throughput-" + part + ":end -->"
}

const tpIntro = `## throughput: the queue's own cost against asynq, River and the store floor

With an instant provider (llmsim with no limit and no latency), how fast do jobs move through llmq
compared with plain asynq, River, and the least a Postgres-then-asynq design must do (insert a row,
enqueue, mark the row done)? Each part below is rewritten by its own mode of
` + "`go run . throughput -mode <throughput|rate|backlog> -write docs/benchmarks.md`" + `.
`

// throughputSection returns the body of the throughput section with part replaced by body. section is
// the current body ("" when the document has none); missing parts are added in their order, and
// text outside the parts (the intro) is kept.
func throughputSection(section, part, body string) (string, error) {
	if strings.TrimSpace(section) == "" {
		section = tpIntro
	}
	for _, p := range tpParts {
		b, e := tpPartMarkers(p)
		if !strings.Contains(section, b) {
			section = strings.TrimRight(section, "\n") + "\n\n" + b + "\n_Not measured yet._\n" + e + "\n"
		}
	}
	b, e := tpPartMarkers(part)
	return replaceSection(section, b, e, body)
}

// sectionBody returns the text between begin and end in doc ("" when begin is missing).
func sectionBody(doc, begin, end string) (string, error) {
	i := strings.Index(doc, begin)
	if i < 0 {
		return "", nil
	}
	rest := doc[i+len(begin):]
	j := strings.Index(rest, end)
	if j < 0 {
		return "", fmt.Errorf("section %s: %w", begin, errNoEndMarker)
	}
	return strings.TrimPrefix(rest[:j], "\n"), nil
}

// writeThroughputPart replaces one part of the throughput section of the Markdown file at path,
// creating the section (and the file) when missing.
func writeThroughputPart(path, part, body string) error {
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	cur, err := sectionBody(string(data), tpBegin, tpEnd)
	if err != nil {
		return fmt.Errorf("update %s: %w", path, err)
	}
	section, err := throughputSection(cur, part, body)
	if err != nil {
		return fmt.Errorf("update %s: %w", path, err)
	}
	return writeSection(path, tpBegin, tpEnd, section)
}
