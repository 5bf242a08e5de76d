package main

import (
	"fmt"
	"slices"
	"time"
)

// phaseStats is what a phase measured, derived from the clients' views and the simulator's
// record of the same calls.
type phaseStats struct {
	ttfd       []time.Duration // submit → first delta event read (first client of each job)
	simTTFB    []time.Duration // the call reached the simulator → its first token flushed
	overSim    []time.Duration // ttfd − simTTFB, per job: what llmq adds
	pickup     []time.Duration // submit → the call reached the simulator
	firstPath  []time.Duration // first token flushed → first delta event read
	toRunning  []time.Duration // submit → running event read
	runToDelta []time.Duration // running event read → first delta event read
	delivery
	retried int // jobs the simulator was called more than once for
}

func (b *streamBench) stats(p *streamPhase) phaseStats {
	var s phaseStats
	for _, j := range p.jobs {
		call, tries := b.sim.call(j.marker)
		if call == nil || len(j.views) == 0 || j.views[0] == nil {
			continue
		}
		if tries > 1 {
			s.retried++
		}
		text, ends, at := call.snapshot()
		if len(at) == 0 {
			continue
		}
		ttfb := at[0].Sub(call.arrived)
		v0 := j.views[0]
		s.simTTFB = append(s.simTTFB, ttfb)
		s.pickup = append(s.pickup, call.arrived.Sub(j.submitted))
		if !v0.firstDelta.IsZero() {
			ttfd := v0.firstDelta.Sub(j.submitted)
			s.ttfd = append(s.ttfd, ttfd)
			s.overSim = append(s.overSim, ttfd-ttfb)
			s.firstPath = append(s.firstPath, v0.firstDelta.Sub(at[0]))
			if !v0.running.IsZero() {
				s.toRunning = append(s.toRunning, v0.running.Sub(j.submitted))
				s.runToDelta = append(s.runToDelta, v0.firstDelta.Sub(v0.running))
			}
		}
		for _, v := range j.views {
			if v == nil {
				continue
			}
			s.add(text, ends, at, v)
		}
	}
	return s
}

func (b *streamBench) report() report {
	phases := b.phases // the burst's: one client per job, then the fan-out
	if b.steadyRun != nil {
		phases = append(slices.Clip(phases), b.steadyRun)
	}
	if b.steadyFanOut != nil {
		phases = append(phases, b.steadyFanOut)
	}
	stats := make([]phaseStats, len(phases))
	for i, p := range phases {
		stats[i] = b.stats(p)
	}
	first, fanOut := stats[0], stats[len(b.phases)-1]
	targets := b.targets(first, fanOut)
	tables := []table{targets, b.firstDeltaTable(fmt.Sprintf("time to first delta, %d jobs at once, one client each", b.s.n), first, true)}
	if b.steadyRun != nil {
		steady := stats[len(b.phases)]
		tables[0].rows = append(tables[0].rows, b.steadyTargets(steady)...)
		if b.steadyFanOut != nil {
			tables[0].rows = append(tables[0].rows, b.steadyFanOutTarget(stats[len(stats)-1]))
		}
		tables = append(tables, b.firstDeltaTable(fmt.Sprintf("time to first delta, %d jobs one every %s (%d streams at once), one client each",
			len(b.steadyRun.jobs), b.steadyRun.spacing, b.s.n), steady, false))
	}
	deliveries := table{
		header: []string{"delivery", "clients", "delta events read", "texts as sent", "lag p50", "p99", "max",
			"after the first delta: lag p50", "p99", "max"},
	}
	cost := table{
		header: []string{"cost", "elapsed", "API CPU", "per delta event", "workers CPU", "Redis CPU", "bench CPU (clients, simulator)", "Redis commands per delta event (delta path)", "Redis bytes in / out per delta event"},
	}
	deliveryRow := func(name string, d delivery) []string {
		return slices.Concat([]string{name, fmt.Sprint(d.clients), fmt.Sprint(d.delivered),
			fmt.Sprintf("%d / %d", d.clients-d.mismatched, d.clients)}, pctCells(d.lags), pctCells(d.steady))
	}
	deliveries.rows = append(deliveries.rows, deliveryRow("the simulator read directly (control)", b.directRead))
	for i, p := range phases {
		s := stats[i]
		deliveries.rows = append(deliveries.rows, deliveryRow(p.name, s.delivery))
		l, n := p.load, float64(max(s.delivered, 1))
		cost.rows = append(cost.rows, []string{p.name, seconds(p.elapsed), msText(l.apiCPU),
			usText(time.Duration(float64(l.apiCPU) / n)), msText(l.workerCPU), msText(l.redisCPU), msText(l.benchCPU),
			fmt.Sprintf("%.2f (%.2f)", float64(l.commands)/n, float64(l.deltaCommands)/n),
			fmt.Sprintf("%.0f / %.0f", float64(l.netIn)/n, float64(l.netOut)/n)})
	}
	if len(b.phases) == 2 {
		a, f := b.phases[0].load, b.phases[1].load
		extra := float64(max(stats[1].delivered-stats[0].delivered, 1))
		cost.rows = append(cost.rows, []string{"the extra clients alone (difference)", "", msText(f.apiCPU - a.apiCPU),
			usText(time.Duration(float64(f.apiCPU-a.apiCPU) / extra)), "", "", "", "", ""})
	}
	retried, gaps, resets := 0, 0, 0
	for _, s := range stats {
		retried, gaps, resets = retried+s.retried, gaps+s.gaps, resets+s.resets
	}
	pool := "Postgres pools of llmq's default size (16 per process)"
	if b.poolConns > 0 {
		pool = fmt.Sprintf("Postgres pools of %d connections per process (pool_max_conns: the machine's Postgres, max_connections 100, is shared with other runs)", b.poolConns)
	}
	if b.poll > 0 {
		pool += fmt.Sprintf("; worker.poll_interval %s", b.poll)
	}
	steadyNote := ""
	if b.steadyRun != nil {
		steadyNote = fmt.Sprintf(" Then the steady phase: %d jobs submitted one every %s for %s, so that %d streams run at once, as a service streaming to its users would see them; its submits are spread, not a burst.",
			len(b.steadyRun.jobs), b.steadyRun.spacing, b.steady, b.s.n)
	}
	if b.steadyFanOut != nil {
		steadyNote += fmt.Sprintf(" Last, the steady phase again with %d clients per job: %d clients at once on %d streams, as in the fan-out, without its burst.",
			b.clients, b.s.n*b.clients, b.s.n)
	}
	layout := b.layout()
	notes := []string{
		fmt.Sprintf("%d streaming jobs per burst phase, all submitted at once, round robin over %s; the simulator (in the bench's process) streams %d tokens of 4 bytes at %g tokens/s. api.max_streams_per_tenant is raised to %d for the run (every job is the anonymous tenant's). %s. A private Redis, so that its counters are llmq's alone. Jobs the simulator was called more than once for: %d; delta events out of order: %d; resets: %d. With %d clients per job, through llmq − the simulator's time to first token was %s p50, %s p99.%s",
			b.s.n, layout, b.tokens, b.tps, b.maxStreams, pool, retried, gaps, resets,
			b.clients, msText(percentile(fanOut.overSim, 50)), msText(percentile(fanOut.overSim, 99)), steadyNote),
		"Lag: for every token the simulator sent and every client, the time from the simulator's flush of the token to the client's read of the delta event that completes it, both stamped on the bench's clock; after the first delta: only the tokens flushed after the client read its first delta event, i.e. the delta path alone (worker → XADD and PUBLISH of the entries → the API's hub → write), without the stream's opening and the attempt's first delta, which waits for the running event's Postgres read. Texts as sent: the client's text assembled from its delta events (checked offset by offset) equals the simulator's, byte for byte.",
		"Cost: the processes' CPU from /proc and Redis's INFO (stats, commandstats) over the whole phase, submits, status events and the queue included, divided by the delta events read; the extra clients' row divides the fan-out phase's excess API CPU over the first by its excess delta events: about what a client more costs (the phases' other work is alike; their Redis writes are not, pieces being merged differently, so Redis is not compared). Delta path commands: XREVRANGE, XADD, PEXPIRE, PUBLISH (the worker's write script) and XRANGE (the API, when a stream opens, after a status event, or when a published batch may be missing).",
		b.busy(),
	}
	notes = append(notes, gomaxprocsNote(b.gomaxprocs)...)
	if s := b.steadyStagesNote(); s != "" {
		notes = append(notes, s)
	}
	notes = append(notes, "Timed on a shared, loaded 2-core machine (every process of the run, the clients and the simulator share the 2 cores): indicative only.")
	return report{tables: append(tables, deliveries, cost), notes: notes}
}

// pctCells renders p50, p99 and the max of ds ("–" each when empty).
func pctCells(ds []time.Duration) []string {
	if len(ds) == 0 {
		return []string{"–", "–", "–"}
	}
	return []string{msText(percentile(ds, 50)), msText(percentile(ds, 99)), msText(slices.Max(ds))}
}

// firstDeltaTable breaks a phase's time to first delta down; withDirect adds the simulator read
// directly (the burst's control, made at once like it) and the difference of the two reads.
func (b *streamBench) firstDeltaTable(title string, s phaseStats, withDirect bool) table {
	row := func(name string, ds []time.Duration) []string { return append([]string{name}, pctCells(ds)...) }
	t := table{header: []string{title, "p50", "p99", "max"}}
	if withDirect {
		diff := func(p float64) string { return msText(percentile(s.ttfd, p) - percentile(b.direct, p)) }
		t.rows = append(t.rows,
			row("the simulator read directly (POST → first content delta)", b.direct),
			row("its own time to first token, direct calls (request in → token flushed)", b.directSim),
			row("through llmq: submit → first delta event", s.ttfd),
			[]string{"difference of the two reads' percentiles", diff(50), diff(99), ""})
	} else {
		t.rows = append(t.rows, row("through llmq: submit → first delta event", s.ttfd))
	}
	t.rows = append(t.rows,
		row("**through llmq − that call's simulator time to first token** (target ≤ 5 / ≤ 20 ms)", s.overSim),
		row("· submit → the simulator gets the call (submit, pick-up, limiter, attempt start)", s.pickup),
		row("· the simulator's time to first token, through llmq", s.simTTFB),
		row("· first token flushed → first delta event read (the delta path)", s.firstPath),
		row("submit → running event read", s.toRunning),
		row("running event read → first delta event read", s.runToDelta))
	return t
}

// steadyStagesNote is where the steady phase's jobs spent their time by stage ("" when the
// stages were not read): the call stage holds the whole stream.
func (b *streamBench) steadyStagesNote() string {
	if b.steadyRun == nil {
		return ""
	}
	line := stagesLine(b.steadyStages, len(b.steadyRun.jobs))
	if line == "" {
		return ""
	}
	return "Steady phase, " + line + " (the call holds the whole stream)."
}

// busy says how much of the machine the fan-out phase's processes took (Postgres not counted).
func (b *streamBench) busy() string {
	p := b.phases[len(b.phases)-1]
	l := p.load
	used := l.apiCPU + l.workerCPU + l.redisCPU + l.benchCPU
	return fmt.Sprintf("In the fan-out phase the API replicas, workers, Redis and the bench (clients, simulator) used %s of CPU in %s, %.0f%% of the 2 cores, Postgres and other runs on the machine not counted.",
		seconds(used), seconds(p.elapsed), 100*used.Seconds()/(2*p.elapsed.Seconds()))
}

// targets judges the targets: the first phase's time to first delta over the
// simulator's, and the last (fan-out) phase's delivery.
func (b *streamBench) targets(first, last phaseStats) table {
	p50, p99 := percentile(first.overSim, 50), percentile(first.overSim, 99)
	var maxLag time.Duration
	if len(last.lags) > 0 {
		maxLag = slices.Max(last.lags)
	}
	intact := last.mismatched == 0 && last.gaps == 0 && last.clients == b.s.n*b.clients
	return table{
		header: []string{"target", "measured", "result"},
		rows: [][]string{
			{"first delta through llmq − the simulator's time to first token, burst, p50 ≤ 5 ms", msText(p50), passText(p50 <= 5*time.Millisecond)},
			{"the same, burst, p99 ≤ 20 ms", msText(p99), passText(p99 <= 20*time.Millisecond)},
			{fmt.Sprintf("every byte to every client in order (%d clients on %d jobs)", b.s.n*b.clients, b.s.n),
				fmt.Sprintf("%d of %d texts as sent, %d out of order", last.clients-last.mismatched, b.s.n*b.clients, last.gaps), passText(intact)},
			{"no client more than 100 ms behind the provider (max lag, fan-out)", msText(maxLag), passText(maxLag <= 100*time.Millisecond)},
		},
	}
}

// steadyTargets judges the time to first delta again on the steady phase, whose n streams
// arrived evenly.
func (b *streamBench) steadyTargets(steady phaseStats) [][]string {
	p50, p99 := percentile(steady.overSim, 50), percentile(steady.overSim, 99)
	return [][]string{
		{fmt.Sprintf("the same, steady (%d streams at once, one submit every %s), p50 ≤ 5 ms", b.s.n, b.steadyRun.spacing), msText(p50), passText(p50 <= 5*time.Millisecond)},
		{"the same, steady, p99 ≤ 20 ms", msText(p99), passText(p99 <= 20*time.Millisecond)},
	}
}

// steadyFanOutTarget judges the lag again on the steady phase with -clients clients per job:
// the fan-out's clients on as many streams, without the burst's submits at once.
func (b *streamBench) steadyFanOutTarget(st phaseStats) []string {
	var maxLag time.Duration
	if len(st.lags) > 0 {
		maxLag = slices.Max(st.lags)
	}
	return []string{fmt.Sprintf("the same, steady (%d streams at once, %d clients per job)", b.s.n, b.clients), msText(maxLag),
		passText(maxLag <= 100*time.Millisecond)}
}

// usText renders a small duration in microseconds: "42 µs".
func usText(d time.Duration) string {
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

// layout says which processes the run's jobs went through and where their CPU is counted.
func (b *streamBench) layout() string {
	if b.serve {
		return fmt.Sprintf("%d `llmq serve` processes (each an API replica and a worker: the API CPU column is empty, their CPU is the workers'), each job followed (Last-Event-ID: 0) on the next one(s)", b.s.workers)
	}
	return fmt.Sprintf("%d API replicas, each followed (Last-Event-ID: 0) on the next replica(s); %d workers", b.apis, b.s.workers)
}
