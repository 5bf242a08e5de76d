package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/llmsim"
)

// herdOpts are the flags of `bench herd`.
type herdOpts struct {
	n        int
	capacity float64
	rate     float64
	workers  int
	bin      string
	build    bool
	write    string
	only     string
	timeout  time.Duration
	seed     uint64
	dbURL    string
	redisURL string
	keepLogs bool
}

// row is one line of the herd table.
type row struct {
	id     string // for -only
	name   string // in the table
	target *target
	note   string
	run    func(ctx context.Context, e *rowEnv) ([]outcome, error)
}

// rowEnv is what a row runs against: its own simulator and API key, and the flags.
type rowEnv struct {
	herdOpts
	simURL   string
	apiKey   string
	progress *progress
	stderr   io.Writer
	// scenario prefixes the row's progress lines ("herd" when empty).
	scenario string
	// onStart, when set, is called once just before the row's first job is submitted.
	onStart func()
	// maxAttempts is the llmq rows' max_attempts per job; 0 means 20.
	maxAttempts int
	// body, when set, is the provider request of job i that the llmq rows submit; nil means
	// messagesBody.
	body func(i int) []byte
}

// requestBody is the provider request of job i.
func (e *rowEnv) requestBody(i int) []byte {
	if e.body != nil {
		return e.body(i)
	}
	return messagesBody(i)
}

// started calls onStart, if any: the rows call it just before they submit the first job.
func (e *rowEnv) started() {
	if e.onStart != nil {
		e.onStart()
	}
}

// jobMaxAttempts is the max_attempts an llmq row submits.
func (e *rowEnv) jobMaxAttempts() int {
	if e.maxAttempts > 0 {
		return e.maxAttempts
	}
	return 20
}

// logf prints an indented progress line of the row's scenario on stderr.
func (e *rowEnv) logf(format string, args ...any) {
	fmt.Fprintf(e.stderr, "%s:   %s\n", scenarioName(e.scenario), fmt.Sprintf(format, args...))
}

func scenarioName(s string) string {
	if s == "" {
		return "herd"
	}
	return s
}

func herdRows(o herdOpts) []row {
	plain := func(s strategy) func(context.Context, *rowEnv) ([]outcome, error) {
		return func(ctx context.Context, e *rowEnv) ([]outcome, error) { return runStrategy(ctx, e, s), nil }
	}
	return []row{
		{id: "no-retry", name: "no retry", run: plain(strategy{attempts: 1})},
		{id: "backoff3", name: "500ms·2^n·U(0.9,1.1), 3 attempts", run: plain(strategy{attempts: 3, delay: tenPercentJitter(backoffBase)})},
		{id: "backoff8", name: "500ms·2^n·U(0.9,1.1), 8 attempts", run: plain(strategy{attempts: 8, delay: tenPercentJitter(backoffBase)})},
		{id: "full-jitter8", name: "full jitter, 8 attempts", run: plain(strategy{attempts: 8, delay: fullJitter(backoffBase, backoffCap)})},
		{id: "retry-after8", name: "Retry-After + full jitter, 8 attempts", run: plain(strategy{attempts: 8, delay: retryAfterJitter(backoffBase, backoffCap)})},
		{
			id: "asynq", name: "asynq, default retry", run: runAsynq,
			note: fmt.Sprintf("asynq runs with its defaults: RetryDelayFunc n⁴ + 15 + U{0..29}·(n+1) s, DelayedTaskCheckInterval 5 s, "+
				"TaskCheckInterval 1 s (only Concurrency = %d and the queue are set). Were it still running at -timeout (%s), it would "+
				"be stopped there and count what had succeeded by then.", o.n, o.timeout),
		},
		{id: "llmq-configured", name: "llmq (limit configured)", target: &herdConfiguredTarget, run: llmqRow(true)},
		{id: "llmq-learned", name: "llmq (limit learned)", target: &herdLearnedTarget, run: llmqRow(false)},
	}
}

func rowIDs(rows []row) []string {
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	return ids
}

// selectRows keeps the rows named in only (comma-separated ids); empty keeps all.
func selectRows(rows []row, only string) ([]row, error) {
	if strings.TrimSpace(only) == "" {
		return rows, nil
	}
	byID := map[string]row{}
	for _, r := range rows {
		byID[r.id] = r
	}
	want := map[string]bool{}
	for id := range strings.SplitSeq(only, ",") {
		id = strings.TrimSpace(id)
		if _, ok := byID[id]; !ok {
			return nil, fmt.Errorf("-only: unknown row %q (rows: %s)", id, strings.Join(rowIDs(rows), ", "))
		}
		want[id] = true
	}
	var out []row
	for _, r := range rows {
		if want[r.id] {
			out = append(out, r)
		}
	}
	return out, nil
}

func parseHerdFlags(args []string, stderr io.Writer) (herdOpts, error) {
	var o herdOpts
	fs := flag.NewFlagSet("herd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.n, "n", 100, "jobs fired at once")
	fs.Float64Var(&o.capacity, "capacity", 20, "the simulator's bucket capacity (requests)")
	fs.Float64Var(&o.rate, "rate", 10, "the simulator's refill rate (requests per second)")
	fs.IntVar(&o.workers, "workers", 4, "worker processes for the llmq rows")
	fs.StringVar(&o.bin, "bin", "../bin", "directory holding the api and worker binaries (built there when missing)")
	fs.BoolVar(&o.build, "build", false, "build the api and worker binaries into -bin even when present")
	fs.StringVar(&o.write, "write", "", "Markdown file whose herd section is replaced with the table (empty: don't write)")
	fs.StringVar(&o.only, "only", "", "comma-separated rows to run (default all): "+strings.Join(rowIDs(herdRows(o)), ", "))
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "cap on each row, from its first submit")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the seed clients' jitter")
	fs.StringVar(&o.dbURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres server for the llmq rows (a database llmq_bench_<random> is created there and dropped)")
	fs.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis for the asynq and llmq rows (unique queues; never flushed)")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the llmq rows' config and process logs (their directory is printed)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	switch {
	case o.n < 1:
		return o, errors.New("-n: must be at least 1")
	case o.capacity < 1:
		return o, errors.New("-capacity: must be at least 1")
	case o.rate <= 0:
		return o, errors.New("-rate: must be positive")
	case o.workers < 1:
		return o, errors.New("-workers: must be at least 1")
	case o.timeout <= 0:
		return o, errors.New("-timeout: must be positive")
	}
	return o, nil
}

// runHerd is `bench herd`: every selected row against a fresh simulator, one table on stdout,
// progress on stderr, and with -write the Markdown section. It returns an error when a row
// could not run (the table is still printed, the file not written); missing a target is not
// an error.
func runHerd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseHerdFlags(args, stderr)
	if err != nil {
		return err
	}
	rows, err := selectRows(herdRows(o), o.only)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if strings.HasPrefix(r.id, "llmq-") {
			if err := ensureBinaries(ctx, o.bin, o.build, stderr); err != nil {
				return err
			}
			break
		}
	}
	floor := floorOf(o.n, o.capacity, o.rate)
	fmt.Fprintf(stderr, "herd: %d jobs at once against a bucket of %g refilling %g/s (floor %s), %d rows\n",
		o.n, o.capacity, o.rate, seconds(floor), len(rows))

	var results []result
	var failed []string
	for i, r := range rows {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", context.Cause(ctx))
		}
		fmt.Fprintf(stderr, "herd: [%d/%d] %s: started\n", i+1, len(rows), r.name)
		res := runRow(ctx, o, r, stderr)
		if res.err != nil {
			failed = append(failed, r.id)
			fmt.Fprintf(stderr, "herd: [%d/%d] %s: error: %v\n", i+1, len(rows), r.name, res.err)
		} else {
			fmt.Fprintf(stderr, "herd: [%d/%d] %s: finished: %d/%d succeeded, %d provider requests, %d 429s, last result %s\n",
				i+1, len(rows), r.name, res.succeeded, res.n, res.requests, res.tooMany, lastText(res))
		}
		results = append(results, res)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}

	rep := report{opts: o, floor: floor, results: results, command: "go run . herd " + strings.Join(args, " "),
		date: time.Now(), machine: machine()}
	fmt.Fprint(stdout, rep.text())
	if len(failed) > 0 {
		return fmt.Errorf("rows did not run: %s (table not written)", strings.Join(failed, ", "))
	}
	if o.write != "" {
		if err := writeSection(o.write, herdBegin, herdEnd, rep.markdown()); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "herd: wrote the table to %s\n", o.write)
	}
	return nil
}

// runRow runs r against a fresh simulator and summarizes it.
func runRow(ctx context.Context, o herdOpts, r row, stderr io.Writer) result {
	sim := llmsim.New(llmsim.Config{Capacity: o.capacity, RefillPerSecond: o.rate})
	srv := httptest.NewServer(sim)
	defer srv.Close()
	e := &rowEnv{herdOpts: o, simURL: srv.URL, apiKey: "sk-bench-" + randHex(8), stderr: stderr}
	e.progress = newProgress(stderr, "herd", r.name, o.n, sim.Stats)
	stop := e.progress.start()
	outs, err := r.run(ctx, e)
	stop()
	if err != nil {
		return result{name: r.name, n: o.n, target: r.target, err: err}
	}
	res := summarize(r.name, outs, sim.Stats(), o.timeout)
	res.target = r.target
	res.note = r.note
	return res
}

// progress reports a running row on stderr every few seconds, so that a long row does not look
// hung. record is safe for concurrent use.
type progress struct {
	w        io.Writer
	scenario string // prefixes each line
	name     string
	n        int
	stats    func() llmsim.Stats
	done     atomic.Int64
	ok       atomic.Int64
}

// newProgress reports row name of scenario ("herd" when empty) running n jobs to w.
func newProgress(w io.Writer, scenario, name string, n int, stats func() llmsim.Stats) *progress {
	return &progress{w: w, scenario: scenarioName(scenario), name: name, n: n, stats: stats}
}

// record counts one job that reached its final outcome.
func (p *progress) record(ok bool) {
	p.done.Add(1)
	if ok {
		p.ok.Add(1)
	}
}

// start prints a line every 2 s until the returned stop is called; stop waits for the printer.
func (p *progress) start() (stop func()) {
	quit, exited := make(chan struct{}), make(chan struct{})
	began := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				st := p.stats()
				fmt.Fprintf(p.w, "%s:   %s: %4.0fs: %d/%d done (%d ok); provider: %d requests, %d 429s\n",
					p.scenario, p.name, time.Since(began).Seconds(), p.done.Load(), p.n, p.ok.Load(), st.Requests, st.ByStatus[429])
			}
		}
	}()
	return func() { close(quit); <-exited }
}

// Markers of the herd section in docs/benchmarks.md.
const (
	herdBegin = "<!-- herd:begin -->"
	herdEnd   = "<!-- herd:end -->"
)

const benchmarksIntro = `# Benchmarks

Figures measured by ` + "`bench/`" + `. Each section is rewritten by the command shown in it
(` + "`-write docs/benchmarks.md`" + `); they are figures from one machine, not timed tests.
`

// report is a finished herd run.
type report struct {
	opts    herdOpts
	floor   time.Duration
	results []result
	command string
	date    time.Time
	machine string
}

func (r report) rows() [][]string {
	out := make([][]string, len(r.results))
	for i, res := range r.results {
		out[i] = cells(res, r.floor)
	}
	return out
}

// notes are the lines under the table: the floor, the targets, row caveats and misses.
func (r report) notes() []string {
	o := r.opts
	notes := []string{fmt.Sprintf("%d jobs fired at once against a token bucket of capacity %g refilling %g/s; floor = (%d − %g) / %g = %s. "+
		"Times are submit → result as the client saw it (llmq: polling GET /v1/jobs/{id}); p50/p95 over succeeded jobs; "+
		"last result counts from the first submit.", o.n, o.capacity, o.rate, o.n, o.capacity, o.rate, seconds(r.floor))}
	notes = append(notes,
		"An earlier experiment with plain clients against the same bucket and 100 calls measured: ±10% backoff with 8 attempts 16.6 s and 375 requests; "+
			"full jitter 17.1 s and 408; Retry-After + jitter 11.8 s and 313; a limiter shared by all senders 8.0 s, 100 requests, 0 429s.",
		"Target, llmq (limit configured): "+herdConfiguredTarget.describe(o.n, r.floor)+".",
		"Target, llmq (limit learned): "+herdLearnedTarget.describe(o.n, r.floor)+".")
	for _, res := range r.results {
		if res.note != "" && res.err == nil {
			notes = append(notes, res.note)
		}
		if res.err != nil {
			first, _, _ := strings.Cut(res.err.Error(), "\n")
			notes = append(notes, fmt.Sprintf("%s: failed: %s", res.name, first))
		} else if res.target != nil {
			if m := res.target.misses(res, r.floor); len(m) > 0 {
				notes = append(notes, fmt.Sprintf("%s misses its target: %s.", res.name, strings.Join(m, "; ")))
			}
		}
	}
	return notes
}

// text is what the command prints.
func (r report) text() string { return sectionText(tableHeader, r.rows(), r.notes()) }

// markdown is the section written between the herd markers.
func (r report) markdown() string {
	return sectionMarkdown("herd: a burst of jobs against a token bucket", r.command, r.date, r.machine, tableHeader, r.rows(), r.notes())
}

// writeSection replaces the begin/end section of the Markdown file at path with body, creating
// the file (with a short intro) when missing. The file is replaced atomically.
func writeSection(path, begin, end, body string) error {
	doc := benchmarksIntro
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		doc = string(data)
	case !errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("read %s: %w", path, err)
	}
	out, err := replaceSection(doc, begin, end, body)
	if err != nil {
		return fmt.Errorf("update %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create directory of %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".bench-*.md")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(out); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// machine describes this computer: OS/arch, nproc and the CPU model when /proc tells it.
func machine() string {
	s := fmt.Sprintf("%s/%s, nproc %d", runtime.GOOS, runtime.GOARCH, runtime.NumCPU())
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				s += ", " + strings.TrimSpace(v)
				break
			}
		}
	}
	return s + ", " + runtime.Version()
}

// randHex returns 2n random hex digits, for unique names.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}
