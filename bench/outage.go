package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// outageOpts are the flags of `bench outage`: herd's (the shared row runners read them) and the
// outage's own.
type outageOpts struct {
	herdOpts
	outage   time.Duration
	cooldown time.Duration
	// maxCooldown caps the breaker's cooldown backoff (0: llmq's default, 2 × cooldown).
	maxCooldown time.Duration
	threshold   int
}

// effectiveMaxCooldown is the breaker's max_cooldown as llmq applies it.
func (o outageOpts) effectiveMaxCooldown() time.Duration {
	if o.maxCooldown == 0 {
		return 2 * o.cooldown
	}
	return o.maxCooldown
}

// drain is the time the provider's bucket needs to serve n jobs once it is healthy and full:
// capacity at once, the rest at the refill rate; zero when the bucket holds them all.
func (o outageOpts) drain() time.Duration { return floorOf(o.n, o.capacity, o.rate) }

// The outage targets, for the llmq row.
const (
	outageMaxRequests     = 10
	outageMaxPerSuccess   = 1.1
	outageRecoverySlack   = 3 * time.Second
	outageJobMaxAttempts  = 50
	outageLLMQRowID       = "llmq"
	outageScenario        = "outage"
	outageDefaultCooldown = 2 * time.Second
	// outageDefaultThreshold and outageDefaultMaxCooldown fit both targets: 3 failures to open
	// leave 7 probes for a 20 s outage, one at most every 2.8 s, and a probe at most 2.8 s after
	// the recovery leaves the drain its time.
	outageDefaultThreshold   = 3
	outageDefaultMaxCooldown = 2800 * time.Millisecond
)

// outageMaxLag is the target on the time from recovery to the last result: the drain time at
// the limit plus outageRecoverySlack.
func (o outageOpts) outageMaxLag() time.Duration { return o.drain() + outageRecoverySlack }

func outageRows(o outageOpts) []row {
	return []row{
		{
			id: "asynq", name: "asynq, default retry", run: runAsynq,
			note: fmt.Sprintf("asynq runs with its defaults: RetryDelayFunc n⁴ + 15 + U{0..29}·(n+1) s, MaxRetry 25, "+
				"DelayedTaskCheckInterval 5 s, TaskCheckInterval 1 s (only Concurrency = %d and the queue are set).", o.n),
		},
		{
			id: "retry-after8", name: "Retry-After + full jitter, 8 attempts",
			run: func(ctx context.Context, e *rowEnv) ([]outcome, error) {
				return runStrategy(ctx, e, strategy{attempts: 8, delay: retryAfterJitter(backoffBase, backoffCap)}), nil
			},
			note: "The best plain client (Retry-After + U(0, 500ms·2ⁿ), 8 attempts) retries 429 (with its Retry-After), 529 and other 5xx; " +
				"the simulator's 529 carries no Retry-After, so during the outage it is plain full jitter, and a job whose 8 attempts " +
				"all land in the outage gives up (counted as a final, unsuccessful result).",
		},
		{
			id: outageLLMQRowID, name: fmt.Sprintf("llmq (%d workers, breaker %d / %s–%s)", o.workers, o.threshold, o.cooldown, o.effectiveMaxCooldown()),
			run: func(ctx context.Context, e *rowEnv) ([]outcome, error) {
				return runLLMQ(ctx, e, llmqSetup{
					limits:  &config.Limits{RequestsPerSecond: o.rate, Burst: int(o.capacity)},
					breaker: &config.Breaker{Threshold: o.threshold, Cooldown: o.cooldown, MaxCooldown: o.maxCooldown, ColdStartCap: true},
				})
			},
			note: fmt.Sprintf("llmq: %d worker processes, the credential's limit configured at %g/s burst %d (the simulator's), "+
				"breaker threshold %d, cooldown %s and max_cooldown %s, jobs submitted with \"timeout\":\"5m\" and \"max_attempts\":%d; "+
				"everything else at llmq's defaults (retry budget 10 + 10%% of first attempts per minute, 3 s longest inline wait).",
				o.workers, o.rate, int(o.capacity), o.threshold, o.cooldown, o.effectiveMaxCooldown(), outageJobMaxAttempts),
		},
	}
}

func parseOutageFlags(args []string, stderr io.Writer) (outageOpts, error) {
	var o outageOpts
	fs := flag.NewFlagSet("outage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.n, "n", 200, "jobs submitted at once")
	fs.DurationVar(&o.outage, "outage", 20*time.Second, "how long the simulator answers 529 overloaded, from the first submit")
	fs.Float64Var(&o.capacity, "capacity", 50, "the simulator's bucket capacity (requests); also llmq's configured burst")
	fs.Float64Var(&o.rate, "rate", 25, "the simulator's refill rate (requests per second); also llmq's configured limit")
	fs.IntVar(&o.workers, "workers", 4, "worker processes for the llmq row")
	fs.DurationVar(&o.cooldown, "cooldown", outageDefaultCooldown, "llmq's breaker cooldown (llmq's default is 30s)")
	fs.DurationVar(&o.maxCooldown, "max-cooldown", outageDefaultMaxCooldown, "llmq's breaker max_cooldown, the cap of the cooldown's doubling after failed probes (0: llmq's default, 2 × -cooldown)")
	fs.IntVar(&o.threshold, "threshold", outageDefaultThreshold, "llmq's breaker threshold (consecutive server-side failures that open it)")
	fs.StringVar(&o.bin, "bin", "../bin", "directory holding the api and worker binaries (built there when missing)")
	fs.BoolVar(&o.build, "build", false, "build the api and worker binaries into -bin even when present")
	fs.StringVar(&o.write, "write", "", "Markdown file whose outage section is replaced with the table (empty: don't write)")
	fs.StringVar(&o.only, "only", "", "comma-separated rows to run (default all): "+strings.Join(rowIDs(outageRows(o)), ", "))
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "cap on each row, from its first submit")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the seed client's jitter")
	fs.StringVar(&o.dbURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres server for the llmq row (a database llmq_bench_<random> is created there and dropped)")
	fs.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis for the asynq and llmq rows (unique queues; never flushed)")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the llmq row's config and process logs (their directory is printed)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	switch {
	case o.n < 1:
		return o, errors.New("-n: must be at least 1")
	case o.outage <= 0:
		return o, errors.New("-outage: must be positive")
	case o.capacity < 1:
		return o, errors.New("-capacity: must be at least 1")
	case o.rate <= 0:
		return o, errors.New("-rate: must be positive")
	case o.workers < 1:
		return o, errors.New("-workers: must be at least 1")
	case o.cooldown < time.Millisecond:
		return o, errors.New("-cooldown: must be at least 1ms")
	case o.threshold < 1:
		return o, errors.New("-threshold: must be at least 1")
	case o.maxCooldown != 0 && o.maxCooldown < o.cooldown:
		return o, errors.New("-max-cooldown: must be 0 or at least -cooldown")
	case o.timeout <= o.outage:
		return o, errors.New("-timeout: must be longer than -outage")
	}
	return o, nil
}

// runOutage is `bench outage`: every selected row against a fresh simulator that answers 529
// for o.outage from the row's first submit, one table on stdout, progress on stderr, and with
// -write the Markdown section. It returns an error when a row could not run (the table is
// still printed, the file not written); missing a target is not an error.
func runOutage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseOutageFlags(args, stderr)
	if err != nil {
		return err
	}
	rows, err := selectRows(outageRows(o), o.only)
	if err != nil {
		return err
	}
	for _, r := range rows {
		if r.id == outageLLMQRowID {
			if err := ensureBinaries(ctx, o.bin, o.build, stderr); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(stderr, "outage: %d jobs at once; 529 for %s from the first submit; bucket %g refilling %g/s (drain %s); %d rows\n",
		o.n, o.outage, o.capacity, o.rate, seconds(o.drain()), len(rows))

	var results []outageResult
	var failed []string
	for i, r := range rows {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", context.Cause(ctx))
		}
		fmt.Fprintf(stderr, "outage: [%d/%d] %s: started\n", i+1, len(rows), r.name)
		res := runOutageRow(ctx, o, r, stderr)
		if res.err != nil {
			failed = append(failed, r.id)
			fmt.Fprintf(stderr, "outage: [%d/%d] %s: error: %v\n", i+1, len(rows), r.name, res.err)
		} else {
			fmt.Fprintf(stderr, "outage: [%d/%d] %s: finished: %d/%d succeeded, %d provider requests (%d during the outage), "+
				"recovery → last result %s\n", i+1, len(rows), r.name, res.succeeded, res.n, res.requests, res.duringOutage, lagText(res))
		}
		results = append(results, res)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}

	rep := outageReport{opts: o, results: results, command: "go run . outage " + strings.Join(args, " "),
		date: time.Now(), machine: machine()}
	fmt.Fprint(stdout, rep.text())
	if len(failed) > 0 {
		return fmt.Errorf("rows did not run: %s (table not written)", strings.Join(failed, ", "))
	}
	if o.write != "" {
		if err := writeSection(o.write, outageBegin, outageEnd, rep.markdown()); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "outage: wrote the table to %s\n", o.write)
	}
	return nil
}

// runOutageRow runs r against a fresh simulator whose outage starts just before the row's
// first submit, and summarizes it.
func runOutageRow(ctx context.Context, o outageOpts, r row, stderr io.Writer) outageResult {
	sim := llmsim.New(llmsim.Config{Capacity: o.capacity, RefillPerSecond: o.rate})
	rec := newSimRecorder(sim)
	srv := httptest.NewServer(rec)
	defer srv.Close()
	e := &rowEnv{herdOpts: o.herdOpts, simURL: srv.URL, apiKey: "sk-bench-" + randHex(8), stderr: stderr,
		scenario: outageScenario, maxAttempts: outageJobMaxAttempts}
	e.progress = newProgress(stderr, outageScenario, r.name, o.n, sim.Stats)
	var startErr error
	e.onStart = func() {
		start := time.Now()
		if startErr = sim.SetFaults(llmsim.Faults{OverloadedFor: o.outage}); startErr == nil {
			rec.begin(start, sim.Faults().OverloadedUntil)
		}
	}
	stop := e.progress.start()
	outs, err := r.run(ctx, e)
	stop()
	if err == nil {
		err = startErr
	}
	judged := r.id == outageLLMQRowID
	if err != nil {
		return outageResult{result: result{name: r.name, n: o.n, err: err}, judged: judged}
	}
	st := sim.Stats()
	res := outageResult{result: summarize(r.name, outs, st, o.timeout), judged: judged, overloaded: st.ByStatus[529]}
	res.note = r.note
	reqs, recovery := rec.snapshot()
	res.recovery = recovery
	for _, q := range reqs {
		if q.duringOutage {
			res.duringOutage++
		}
	}
	return res
}

// outageResult is one row of the outage table.
type outageResult struct {
	result
	// overloaded counts the simulator's 529 answers.
	overloaded int
	// duringOutage counts the provider requests the simulator received before the recovery
	// instant.
	duringOutage int
	// recovery is the recovery instant, since the row's first submit.
	recovery time.Duration
	// judged marks the row the targets apply to (llmq).
	judged bool
}

// lag is the time from the recovery instant to the last final outcome (negative when every job
// ended before recovery); when the row timed out, the lag at its timeout.
func (r outageResult) lag() time.Duration { return r.last - r.recovery }

func lagText(r outageResult) string {
	if !r.complete {
		return "> " + seconds(r.lag())
	}
	return seconds(r.lag())
}

// outageCheck is one target and how a row did against it.
type outageCheck struct {
	what string // the target, e.g. "requests during the outage ≤ 10"
	got  string
	pass bool
}

// outageChecks judges r against the outage targets for n jobs and a drain time of drain.
func outageChecks(r outageResult, n int, drain time.Duration) []outageCheck {
	perSuccess := "n/a"
	var ratio float64
	if r.succeeded > 0 {
		ratio = float64(r.requests) / float64(r.succeeded)
		perSuccess = fmt.Sprintf("%.2f", ratio)
	}
	maxLag := drain + outageRecoverySlack
	return []outageCheck{
		{what: fmt.Sprintf("%d/%d succeeded", n, n), got: fmt.Sprintf("%d/%d", r.succeeded, r.n), pass: r.succeeded == n && r.n == n},
		{what: fmt.Sprintf("provider requests during the outage ≤ %d", outageMaxRequests), got: fmt.Sprint(r.duringOutage),
			pass: r.duringOutage <= outageMaxRequests},
		{what: fmt.Sprintf("requests per success ≤ %.1f", outageMaxPerSuccess), got: perSuccess,
			pass: r.succeeded > 0 && ratio <= outageMaxPerSuccess+1e-9},
		{what: fmt.Sprintf("last result ≤ recovery + drain %s + %s = recovery + %s", seconds(drain), seconds(outageRecoverySlack), seconds(maxLag)),
			got: "recovery + " + lagText(r), pass: r.complete && r.lag() <= maxLag},
	}
}

// outageVerdict is the target column: PASS, FAIL, or empty for rows without targets.
func outageVerdict(r outageResult, n int, drain time.Duration) string {
	if !r.judged {
		return ""
	}
	if r.err != nil {
		return "FAIL"
	}
	for _, c := range outageChecks(r, n, drain) {
		if !c.pass {
			return "FAIL"
		}
	}
	return "PASS"
}

var outageHeader = []string{"strategy", "succeeded", "requests during outage", "529s", "429s", "total requests",
	"requests/success", "recovery → last result", "target"}

// outageCells renders a row's columns (outageHeader order).
func outageCells(r outageResult, n int, drain time.Duration) []string {
	if r.err != nil {
		return []string{r.name, "error", "", "", "", "", "", "", outageVerdict(r, n, drain)}
	}
	perSuccess := "n/a"
	if r.succeeded > 0 {
		perSuccess = fmt.Sprintf("%.2f", float64(r.requests)/float64(r.succeeded))
	}
	return []string{
		r.name,
		fmt.Sprintf("%d/%d", r.succeeded, r.n),
		fmt.Sprint(r.duringOutage),
		fmt.Sprint(r.overloaded),
		fmt.Sprint(r.tooMany),
		fmt.Sprint(r.requests),
		perSuccess,
		lagText(r),
		outageVerdict(r, n, drain),
	}
}

// Markers of the outage section in docs/benchmarks.md.
const (
	outageBegin = "<!-- outage:begin -->"
	outageEnd   = "<!-- outage:end -->"
)

// outageReport is a finished outage run.
type outageReport struct {
	opts    outageOpts
	results []outageResult
	command string
	date    time.Time
	machine string
}

func (r outageReport) rows() [][]string {
	out := make([][]string, len(r.results))
	for i, res := range r.results {
		out[i] = outageCells(res, r.opts.n, r.opts.drain())
	}
	return out
}

// notes are the lines under the table: the setup, the targets with PASS/FAIL for the llmq
// row, the cooldown used, and row caveats.
func (r outageReport) notes() []string {
	o := r.opts
	drain := o.drain()
	notes := []string{
		fmt.Sprintf("%d jobs submitted at once. The simulator answers every request 529 overloaded_error (no Retry-After) for the first %s, "+
			"measured from the first submit, then recovers; its token bucket (capacity %g, refill %g/s) is charged before the overload "+
			"check, so a request during the outage either costs a token and gets 529 or is refused 429 with Retry-After.",
			o.n, o.outage, o.capacity, o.rate),
		"Requests during outage: provider requests the simulator received before the recovery instant (counted around its handler). " +
			"Recovery → last result: from the recovery instant to the last final outcome (a success, or a client giving up); " +
			"negative when every job had ended before recovery.",
		fmt.Sprintf("Outage targets, judged on the llmq row: %d/%d succeeded; ≤ %d provider requests during the outage (probes only); "+
			"≤ %.1f requests per success; last result ≤ recovery + drain + %s, drain = max(0, (n − capacity) / rate) = (%d − %g) / %g = %s.",
			o.n, o.n, outageMaxRequests, outageMaxPerSuccess, seconds(outageRecoverySlack), o.n, o.capacity, o.rate, seconds(drain)),
	}
	for _, res := range r.results {
		if res.err != nil {
			first, _, _ := strings.Cut(res.err.Error(), "\n")
			notes = append(notes, fmt.Sprintf("%s: failed: %s", res.name, first))
			continue
		}
		if res.note != "" {
			notes = append(notes, res.note)
		}
		if res.judged {
			var parts []string
			for _, c := range outageChecks(res, o.n, drain) {
				v := "FAIL"
				if c.pass {
					v = "PASS"
				}
				parts = append(parts, fmt.Sprintf("%s: %s (%s)", c.what, v, c.got))
			}
			notes = append(notes, fmt.Sprintf("%s against its targets: %s.", res.name, strings.Join(parts, "; ")))
		}
	}
	return notes
}

// text is what the command prints.
func (r outageReport) text() string { return sectionText(outageHeader, r.rows(), r.notes()) }

// markdown is the section written between the outage markers.
func (r outageReport) markdown() string {
	return sectionMarkdown("outage: a burst of jobs while the provider is overloaded", r.command, r.date, r.machine, outageHeader, r.rows(), r.notes())
}
