package main

import (
	"context"
	"fmt"
	"io"
	"strings"
)

// scenario is one benchmark. Every scenario has the same shape: its flags (its own and those
// of the shared set it takes), a run that measures, and a report that judges what was
// measured against the scenario's targets and renders it as tables and notes.
type scenario interface {
	// flags registers the scenario's flags on fs; s receives the shared ones, and the scenario
	// keeps s for run and report.
	flags(fs *flagSet, s *shared)
	// run measures. A row that cannot run is recorded for the report; an error means there is
	// nothing to report.
	run(ctx context.Context, log logf) error
	// report judges and renders what run measured.
	report() report
}

// logf prints one progress line of a scenario on stderr.
type logf func(format string, args ...any)

// entry is a scenario as the command line knows it.
type entry struct {
	name  string // the command and the name of its section in docs/benchmarks.md
	about string // one line of the usage
	new   func() scenario
}

// scenarios lists every scenario, in the order of docs/benchmarks.md.
func scenarios() []entry {
	return []entry{
		{name: "herd", about: "N jobs at once against a token bucket: plain retrying clients, plain asynq and llmq",
			new: func() scenario { return &herd{} }},
		{name: "outage", about: "N jobs at once while the provider answers 529 for a while: asynq, a client, llmq's breaker",
			new: func() scenario { return &outage{} }},
		{name: "tokens", about: "N long prompts at once against input- and output-token limits",
			new: func() scenario { return &tokensBench{} }},
		{name: "chaos", about: "jobs while workers are killed, Redis flushed and Postgres cut off",
			new: func() scenario { return &chaos{} }},
		{name: "throughput", about: "an instant provider: llmq, asynq, River and two floors, as fast as each goes",
			new: func() scenario { return &throughput{} }},
		{name: "instructions", about: "instructions per job of llmq serve and of the floor over HTTP, counted by valgrind's callgrind",
			new: func() scenario { return &instructionsBench{} }},
		{name: "rate", about: "the same systems at fixed offered rates: latency at a steady load",
			new: func() scenario { return &rate{} }},
		{name: "backlog", about: "llmq draining a large queued backlog, against a small one",
			new: func() scenario { return &backlog{} }},
		{name: "retention", about: "llmq draining a backlog while the retention pass deletes from a million finished jobs, and without it",
			new: func() scenario { return &retention{} }},
		{name: "batch", about: "jobs with \"lane\": \"auto\" through the providers' batch APIs: cost, provider calls, the online lane beside them, a leader crash",
			new: func() scenario { return &batchBench{} }},
		{name: "stream", about: "streaming jobs over API replicas: first delta against the simulator's, each token's lag, every client's text, CPU and Redis per delta",
			new: func() scenario { return &streamBench{} }},
		{name: "fairness", about: "two tenants and three priorities sharing one credential, llmq beside asynq 6:3:1: waits, shares, 429s",
			new: func() scenario { return &fairness{} }},
	}
}

// usage lists the scenarios.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: bench <scenario> [flags]   (run in bench/; \"bench <scenario> -h\" lists its flags)\n\nscenarios:\n")
	for _, e := range scenarios() {
		fmt.Fprintf(&b, "  %-10s %s\n", e.name, e.about)
	}
	return b.String()
}

// runScenario parses the flags of e, runs it, prints its report on stdout and, with -write,
// replaces its section of the Markdown file. A report with rows that could not run is printed
// but not written, and is an error; a missed target is not.
func runScenario(ctx context.Context, e entry, args []string, stdout, stderr io.Writer) error {
	var s shared
	sc := e.new()
	fs := newFlagSet(e.name, stderr)
	sc.flags(fs, &s)
	if err := fs.parse(args); err != nil {
		return err
	}
	log := func(format string, a ...any) { fmt.Fprintf(stderr, "%s: %s\n", e.name, fmt.Sprintf(format, a...)) }
	head := newHead(e.name, args)
	if err := sc.run(ctx, log); err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	rep := sc.report()
	fmt.Fprint(stdout, rep.text())
	if len(rep.failed) > 0 {
		return fmt.Errorf("rows did not run: %s (table not written)", strings.Join(rep.failed, ", "))
	}
	if s.write == "" {
		return nil
	}
	if err := writeSection(s.write, e.name, rep.markdown(head)); err != nil {
		return err
	}
	log("wrote the table to %s", s.write)
	return nil
}
