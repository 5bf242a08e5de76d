package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// tokensOpts are the flags of `bench tokens`.
type tokensOpts struct {
	n           int
	inputTokens int // per job: the prompt is 4 × inputTokens bytes of text
	maxTokens   int // per job: max_tokens
	replyTokens int // the simulator's reply length in tokens
	rps         float64
	burst       int
	inputTPM    int
	outputTPM   int
	tokenMinute time.Duration
	latency     time.Duration
	workers     int
	bin         string
	build       bool
	write       string
	only        string
	timeout     time.Duration
	dbURL       string
	redisURL    string
	keepLogs    bool
}

// herdOpts is the part of the options the shared llmq row runner reads.
func (o tokensOpts) herdOpts() herdOpts {
	return herdOpts{n: o.n, capacity: float64(o.burst), rate: o.rps, workers: o.workers, bin: o.bin, build: o.build,
		timeout: o.timeout, dbURL: o.dbURL, redisURL: o.redisURL, keepLogs: o.keepLogs}
}

// simConfig is the simulator of every row: the request bucket and both token buckets.
func (o tokensOpts) simConfig() llmsim.Config {
	return llmsim.Config{
		Capacity: float64(o.burst), RefillPerSecond: o.rps,
		InputTokensPerMinute: o.inputTPM, OutputTokensPerMinute: o.outputTPM, TokenMinute: o.tokenMinute,
		ReplyTokens: o.replyTokens, Latency: o.latency,
	}
}

// replyTokensPerJob is the output tokens one successful answer carries (and is charged): the
// simulator's reply length, cut at max_tokens.
func (o tokensOpts) replyTokensPerJob() int { return min(o.replyTokens, o.maxTokens) }

// buckets are the simulator's buckets with what the n jobs are charged in each: a request each,
// inputTokens each, and the reply's output tokens each (the output reservation of max_tokens
// is trued down to the reply when the answer is decided).
func (o tokensOpts) buckets() []floorBucket {
	minute := o.tokenMinute.Seconds()
	return []floorBucket{
		{name: "requests", unit: "", charged: float64(o.n), perJob: 1, capacity: float64(o.burst), rate: o.rps},
		{name: "input tokens", unit: "tokens", charged: float64(o.inputTokens * o.n), perJob: o.inputTokens,
			capacity: float64(o.inputTPM), rate: float64(o.inputTPM) / minute},
		{name: "output tokens", unit: "tokens", charged: float64(o.replyTokensPerJob() * o.n), perJob: o.replyTokensPerJob(),
			capacity: float64(o.outputTPM), rate: float64(o.outputTPM) / minute},
	}
}

// floorBucket is one of the provider's buckets and what a run charges it.
type floorBucket struct {
	name     string
	unit     string  // "tokens", or "" for requests
	charged  float64 // the total the run charges
	perJob   int     // the charge of one job (for the notes)
	capacity float64 // what the bucket holds when full (it starts full)
	rate     float64 // its refill per second
}

// time is how long the bucket needs to admit everything charged: what it holds at once, the
// rest at its refill rate; 0 when it holds everything or does not refill.
func (b floorBucket) time() time.Duration {
	if b.rate <= 0 {
		return 0
	}
	return time.Duration(math.Max(0, b.charged-b.capacity) / b.rate * float64(time.Second))
}

// tokenFloor is the binding bucket's time: the maximum over buckets of
// max(0, charged − capacity) / rate, and the index of that bucket (-1 for none).
func tokenFloor(buckets []floorBucket) (time.Duration, int) {
	var floor time.Duration
	binding := -1
	for i, b := range buckets {
		if t := b.time(); binding < 0 || t > floor {
			floor, binding = t, i
		}
	}
	return floor, binding
}

// tokensTarget is what a judged row of the tokens table must reach (the token targets); every
// row must also succeed every job.
type tokensTarget struct {
	maxRatio      float64 // last result ≤ maxRatio × floor
	no429         bool    // zero 429 answers
	maxPerSuccess float64 // provider requests / successes ≤ this; 0: not judged
}

// The token targets: with the token limits known, and learned.
var (
	tokensKnownTarget   = tokensTarget{maxRatio: 1.05, no429: true}
	tokensLearnedTarget = tokensTarget{maxRatio: 1.15, maxPerSuccess: 1.1}
)

// tokensCheck is one target and how a row did against it.
type tokensCheck struct {
	what string // the target, e.g. "0 429s"
	got  string
	pass bool
}

// checks judges r against t for a floor of floor. A row that failed to run fails every check.
func (t tokensTarget) checks(r result, floor time.Duration) []tokensCheck {
	ran := r.err == nil
	var out []tokensCheck
	out = append(out, tokensCheck{what: fmt.Sprintf("%d/%d succeeded", r.n, r.n), got: fmt.Sprintf("%d/%d", r.succeeded, r.n),
		pass: ran && r.succeeded == r.n})
	if t.no429 {
		out = append(out, tokensCheck{what: "0 429s", got: fmt.Sprint(r.tooMany), pass: ran && r.tooMany == 0})
	}
	limit := time.Duration(math.Round(t.maxRatio * float64(floor))) // 1.15 × 24 s is 27.6 s, not a hair less
	ratio := "n/a"
	if floor > 0 {
		ratio = fmt.Sprintf("%.2f × floor", r.last.Seconds()/floor.Seconds())
	}
	out = append(out, tokensCheck{
		what: fmt.Sprintf("last result ≤ %.2f × floor (%s)", t.maxRatio, seconds(limit)),
		got:  lastText(r) + ", " + ratio,
		pass: ran && r.complete && r.last <= limit,
	})
	if t.maxPerSuccess > 0 {
		got, ratio := "n/a", math.Inf(1)
		if r.succeeded > 0 {
			ratio = float64(r.requests) / float64(r.succeeded)
			got = fmt.Sprintf("%.2f", ratio)
		}
		out = append(out, tokensCheck{what: fmt.Sprintf("requests per success ≤ %.1f", t.maxPerSuccess), got: got,
			pass: ran && ratio <= t.maxPerSuccess+1e-9})
	}
	return out
}

// verdict is PASS when every check passes, else FAIL.
func (t tokensTarget) verdict(r result, floor time.Duration) string {
	for _, c := range t.checks(r, floor) {
		if !c.pass {
			return "FAIL"
		}
	}
	return "PASS"
}

// tokensRow is one line of the tokens table: llmq configured by setup, against a simulator
// whose token headers are hidden from llmq when hideTokens.
type tokensRow struct {
	id, name   string
	setup      llmqSetup
	hideTokens bool
	target     *tokensTarget // nil: not judged
}

func tokensRows(o tokensOpts) []tokensRow {
	requestsOnly := &config.Limits{RequestsPerSecond: o.rps, Burst: o.burst}
	known := &config.Limits{RequestsPerSecond: o.rps, Burst: o.burst,
		InputTokensPerMinute: float64(o.inputTPM), OutputTokensPerMinute: float64(o.outputTPM)}
	return []tokensRow{
		{id: "llmq-requests", name: "llmq, request limit only", hideTokens: true,
			setup: llmqSetup{limits: requestsOnly, tokenMinute: o.tokenMinute}},
		{id: "llmq-known", name: "llmq, token limits known", target: &tokensKnownTarget,
			setup: llmqSetup{limits: known, tokenMinute: o.tokenMinute}},
		{id: "llmq-learned", name: "llmq, token limits learned", target: &tokensLearnedTarget,
			setup: llmqSetup{limits: requestsOnly, tokenMinute: o.tokenMinute}},
	}
}

// selectTokensRows keeps the rows named in only (comma-separated ids); empty keeps all.
func selectTokensRows(rows []tokensRow, only string) ([]tokensRow, error) {
	plain := make([]row, len(rows))
	byID := map[string]tokensRow{}
	for i, r := range rows {
		plain[i] = row{id: r.id, name: r.name}
		byID[r.id] = r
	}
	kept, err := selectRows(plain, only)
	if err != nil {
		return nil, err
	}
	out := make([]tokensRow, len(kept))
	for i, r := range kept {
		out[i] = byID[r.id]
	}
	return out, nil
}

func tokensRowIDs(o tokensOpts) []string {
	var ids []string
	for _, r := range tokensRows(o) {
		ids = append(ids, r.id)
	}
	return ids
}

func parseTokensFlags(args []string, stderr io.Writer) (tokensOpts, error) {
	var o tokensOpts
	fs := flag.NewFlagSet("tokens", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.n, "n", 100, "jobs submitted at once")
	fs.IntVar(&o.inputTokens, "input-tokens", 2000, "input tokens per job (the prompt is 4 bytes of text per token)")
	fs.IntVar(&o.maxTokens, "max-tokens", 200, "max_tokens per job")
	fs.IntVar(&o.replyTokens, "reply-tokens", 150, "output tokens of every reply (the simulator's ReplyTokens)")
	fs.Float64Var(&o.rps, "rps", 50, "the credential's request limit (requests per second)")
	fs.IntVar(&o.burst, "burst", 50, "the credential's request burst")
	fs.IntVar(&o.inputTPM, "input-tpm", 40000, "the credential's input tokens per (token) minute")
	fs.IntVar(&o.outputTPM, "output-tpm", 8000, "the credential's output tokens per (token) minute")
	fs.DurationVar(&o.tokenMinute, "token-minute", 6*time.Second,
		"length of the token \"minute\" in the simulator and llmq's worker.token_minute (1m is real time)")
	fs.DurationVar(&o.latency, "latency", 0, "the simulator's answer latency (0: answers at once, like herd)")
	fs.IntVar(&o.workers, "workers", 4, "worker processes per row")
	fs.StringVar(&o.bin, "bin", "../bin", "directory holding the api and worker binaries (built there when missing)")
	fs.BoolVar(&o.build, "build", false, "build the api and worker binaries into -bin even when present")
	fs.StringVar(&o.write, "write", "", "Markdown file whose tokens section is replaced with the table (empty: don't write)")
	fs.StringVar(&o.only, "only", "", "comma-separated rows to run (default all): "+strings.Join(tokensRowIDs(o), ", "))
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "cap on each row, from its first submit")
	fs.StringVar(&o.dbURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres server for the rows (a database llmq_bench_<random> is created there and dropped)")
	fs.StringVar(&o.redisURL, "redis-url", "redis://127.0.0.1:6379/0", "Redis for the rows (unique queues; never flushed)")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the rows' config and process logs (their directory is printed)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	switch {
	case o.n < 1:
		return o, errors.New("-n: must be at least 1")
	case o.inputTokens < 1:
		return o, errors.New("-input-tokens: must be at least 1")
	case o.maxTokens < 1:
		return o, errors.New("-max-tokens: must be at least 1")
	case o.replyTokens < 1:
		return o, errors.New("-reply-tokens: must be at least 1")
	case o.rps <= 0:
		return o, errors.New("-rps: must be positive")
	case o.burst < 1:
		return o, errors.New("-burst: must be at least 1")
	case o.inputTPM < o.inputTokens:
		return o, errors.New("-input-tpm: must be at least -input-tokens (else every request is refused 400)")
	case o.outputTPM < o.maxTokens:
		return o, errors.New("-output-tpm: must be at least -max-tokens (else every request is refused 400)")
	case o.tokenMinute < time.Second:
		return o, errors.New("-token-minute: must be at least 1s (llmq's limiter needs that)")
	case o.latency < 0:
		return o, errors.New("-latency: must not be negative")
	case o.workers < 1:
		return o, errors.New("-workers: must be at least 1")
	case o.timeout <= 0:
		return o, errors.New("-timeout: must be positive")
	}
	return o, nil
}

// tokensScenario prefixes the progress lines.
const tokensScenario = "tokens"

// runTokens is `bench tokens`: every selected row against a fresh simulator, one table on
// stdout, progress on stderr, and with -write the Markdown section. It returns an error when a
// row could not run (the table is still printed, the file not written); missing a target is not
// an error.
func runTokens(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseTokensFlags(args, stderr)
	if err != nil {
		return err
	}
	rows, err := selectTokensRows(tokensRows(o), o.only)
	if err != nil {
		return err
	}
	if err := ensureBinaries(ctx, o.bin, o.build, stderr); err != nil {
		return err
	}
	floor, binding := tokenFloor(o.buckets())
	fmt.Fprintf(stderr, "tokens: %d jobs of %d input tokens and max_tokens %d at once; %g requests/s (burst %d), %d input and %d output "+
		"tokens per %s; floor %s (%s); %d rows\n", o.n, o.inputTokens, o.maxTokens, o.rps, o.burst, o.inputTPM, o.outputTPM,
		o.tokenMinute, seconds(floor), o.buckets()[binding].name, len(rows))

	var results []tokensResult
	var failed []string
	for i, r := range rows {
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", context.Cause(ctx))
		}
		fmt.Fprintf(stderr, "tokens: [%d/%d] %s: started\n", i+1, len(rows), r.name)
		res := runTokensRow(ctx, o, r, stderr)
		if res.err != nil {
			failed = append(failed, r.id)
			fmt.Fprintf(stderr, "tokens: [%d/%d] %s: error: %v\n", i+1, len(rows), r.name, res.err)
		} else {
			fmt.Fprintf(stderr, "tokens: [%d/%d] %s: finished: %d/%d succeeded, %d provider requests, %d 429s, %d 400s, "+
				"last result %s; the simulator charged %d input and %d output tokens\n", i+1, len(rows), r.name, res.succeeded, res.n,
				res.requests, res.tooMany, res.byStatus[400], lastText(res.result), res.inputCharged, res.outputCharged)
		}
		results = append(results, res)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}

	rep := tokensReport{opts: o, floor: floor, binding: binding, results: results,
		command: "go run . tokens " + strings.Join(args, " "), date: time.Now(), machine: machine()}
	fmt.Fprint(stdout, rep.text())
	if len(failed) > 0 {
		return fmt.Errorf("rows did not run: %s (table not written)", strings.Join(failed, ", "))
	}
	if o.write != "" {
		if err := writeSection(o.write, tokensBegin, tokensEnd, rep.markdown()); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "tokens: wrote the table to %s\n", o.write)
	}
	return nil
}

// tokensResult is one row of the tokens table.
type tokensResult struct {
	result
	id           string
	hideTokens   bool
	tokensTarget *tokensTarget
	// inputCharged and outputCharged are the tokens the simulator charged (Stats).
	inputCharged, outputCharged int
	byStatus                    map[int]int
}

// runTokensRow runs r against a fresh simulator and summarizes it.
func runTokensRow(ctx context.Context, o tokensOpts, r tokensRow, stderr io.Writer) tokensResult {
	sim := llmsim.New(o.simConfig())
	var h http.Handler = sim
	if r.hideTokens {
		h = hideTokenHeaders(sim)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	e := &rowEnv{herdOpts: o.herdOpts(), simURL: srv.URL, apiKey: "sk-bench-" + randHex(8), stderr: stderr,
		scenario: tokensScenario, body: func(i int) []byte { return tokensBody(i, o.inputTokens, o.maxTokens) }}
	e.progress = newProgress(stderr, tokensScenario, r.name, o.n, sim.Stats)
	stop := e.progress.start()
	outs, err := runLLMQ(ctx, e, r.setup)
	stop()
	if err != nil {
		return tokensResult{result: result{name: r.name, n: o.n, err: err}, id: r.id, hideTokens: r.hideTokens, tokensTarget: r.target}
	}
	st := sim.Stats()
	return tokensResult{result: summarize(r.name, outs, st, o.timeout), id: r.id, hideTokens: r.hideTokens, tokensTarget: r.target,
		inputCharged: st.InputTokens, outputCharged: st.OutputTokens, byStatus: st.ByStatus}
}

// tokensFiller pads the prompts.
const tokensFiller = "The quick brown fox jumps over the lazy dog. "

// tokensBody is job i's Anthropic Messages request: one user message of exactly
// 4 × inputTokens bytes of ASCII text (inputTokens by the simulator's rule, bytes / 4) that
// starts with the job's number, and max_tokens maxTokens.
func tokensBody(i, inputTokens, maxTokens int) []byte {
	size := 4 * inputTokens
	var b strings.Builder
	b.Grow(size + len(tokensFiller))
	fmt.Fprintf(&b, "tokens request %d: ", i)
	for b.Len() < size {
		b.WriteString(tokensFiller)
	}
	text := b.String()[:size]
	return fmt.Appendf(nil, `{"model":"claude-bench","max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, maxTokens, text)
}

// Markers of the tokens section in docs/benchmarks.md.
const (
	tokensBegin = "<!-- tokens:begin -->"
	tokensEnd   = "<!-- tokens:end -->"
)

// tokensReport is a finished tokens run.
type tokensReport struct {
	opts    tokensOpts
	floor   time.Duration
	binding int // index of the binding bucket in opts.buckets()
	results []tokensResult
	command string
	date    time.Time
	machine string
}

func (r tokensReport) rows() [][]string {
	out := make([][]string, len(r.results))
	for i, res := range r.results {
		c := cells(res.result, r.floor) // herd's columns; the target column is this scenario's
		c[len(c)-1] = ""
		if res.tokensTarget != nil {
			c[len(c)-1] = res.tokensTarget.verdict(res.result, r.floor)
		}
		out[i] = c
	}
	return out
}

// floorNote states the floor's formula with every bucket's numbers.
func floorNote(o tokensOpts, floor time.Duration, binding int) string {
	var parts []string
	for _, b := range o.buckets() {
		switch b.unit {
		case "":
			parts = append(parts, fmt.Sprintf("requests: (%d − %g) / %g/s = %s", o.n, b.capacity, b.rate, seconds(b.time())))
		default:
			parts = append(parts, fmt.Sprintf("%s: (%s × %d − %s) / (%s / %s) = %s", b.name, thousands(b.perJob), o.n,
				thousands(int(b.capacity)), thousands(int(b.capacity)), o.tokenMinute, seconds(b.time())))
		}
	}
	return fmt.Sprintf("Token floor = the binding bucket's time = max over buckets of max(0, total charged − capacity) / refill rate, "+
		"with input charged %s × n and output charged the actual reply tokens × n (%s; reservations of max_tokens are trued down): %s. "+
		"Floor %s (%s).", thousands(o.inputTokens), thousands(o.replyTokensPerJob()), strings.Join(parts, "; "), seconds(floor),
		o.buckets()[binding].name)
}

// notes are the lines under the table: the setup, the floor, the rows, the targets with
// PASS/FAIL, and what the simulator charged.
func (r tokensReport) notes() []string {
	o := r.opts
	latency := "the simulator answers at once (-latency 0)"
	if o.latency > 0 {
		latency = fmt.Sprintf("every answer takes %s (-latency)", o.latency)
	}
	notes := []string{
		fmt.Sprintf("%d jobs submitted at once, each one user message of %s bytes of text (%s input tokens by the simulator's rule, "+
			"bytes / 4, which llmq's estimate also uses) and max_tokens %d; the simulator replies %d tokens, so each output "+
			"reservation of %d is trued down to %d. The credential is limited to %g requests/s (burst %d), %s input and %s output "+
			"tokens per minute. The minute is scaled down to %s (the simulator's TokenMinute and llmq's worker.token_minute): the "+
			"buckets hold %s and %s tokens and refill that many per %s, so the run is %.0f× shorter than with real minutes. "+
			"%d worker processes per row, %s. Times are submit → result as the client saw it (polling GET /v1/jobs/{id}); "+
			"p50/p95 over succeeded jobs; last result counts from the first submit.",
			o.n, thousands(4*o.inputTokens), thousands(o.inputTokens), o.maxTokens, o.replyTokens, o.maxTokens, o.replyTokensPerJob(),
			o.rps, o.burst, thousands(o.inputTPM), thousands(o.outputTPM), o.tokenMinute, thousands(o.inputTPM),
			thousands(o.outputTPM), o.tokenMinute, time.Minute.Seconds()/o.tokenMinute.Seconds(), o.workers, latency),
		floorNote(o, r.floor, r.binding),
		"Rows: request limit only = today's behaviour: only requests_per_second and burst configured, and the simulator's token " +
			"headers (anthropic-ratelimit-*tokens-*) stripped before llmq sees them, so no token limit can be learned; token limits " +
			"known = all four limits configured; token limits learned = only the request limit configured, token limits learned " +
			"from the headers. Every row: jobs with \"timeout\":\"5m\" and \"max_attempts\":20, llmq's defaults otherwise.",
		"Token targets: known → 0 429s and last result ≤ 1.05 × floor; learned → last result ≤ 1.15 × floor and ≤ 1.1 " +
			"requests per success; both with every job succeeded.",
	}
	for _, res := range r.results {
		if res.err != nil {
			first, _, _ := strings.Cut(res.err.Error(), "\n")
			notes = append(notes, fmt.Sprintf("%s: failed: %s", res.name, first))
			continue
		}
		if res.hideTokens {
			notes = append(notes, requestOnlyNote(res, o))
		}
		if res.tokensTarget != nil {
			var parts []string
			for _, c := range res.tokensTarget.checks(res.result, r.floor) {
				v := "FAIL"
				if c.pass {
					v = "PASS"
				}
				parts = append(parts, fmt.Sprintf("%s: %s (%s)", c.what, v, c.got))
			}
			notes = append(notes, fmt.Sprintf("%s against its targets: %s.", res.name, strings.Join(parts, "; ")))
		}
	}
	var charged []string
	for _, res := range r.results {
		if res.err == nil {
			charged = append(charged, fmt.Sprintf("%s %s input and %s output tokens (%d answers 400)", res.name,
				thousands(res.inputCharged), thousands(res.outputCharged), res.byStatus[400]))
		}
	}
	if len(charged) > 0 {
		notes = append(notes, fmt.Sprintf("The simulator charged (Stats; the floor assumes %s input and %s output): %s.",
			thousands(o.inputTokens*o.n), thousands(o.replyTokensPerJob()*o.n), strings.Join(charged, "; ")))
	}
	return notes
}

// requestOnlyNote explains the request-only row's numbers: its retries, and the timeout if hit.
func requestOnlyNote(res tokensResult, o tokensOpts) string {
	s := fmt.Sprintf("%s: llmq paces requests only, so the first wave overdraws the input bucket (%s tokens hold %d prompts) "+
		"and the rest are refused 429 with Retry-After; %d provider requests = %d first attempts + %d retries, which llmq's retry "+
		"budget (10 + 10%% of first attempts per 60 s window) spaces out, so most of the row waits on that budget",
		res.name, thousands(o.inputTPM), o.inputTPM/o.inputTokens, res.requests, min(res.requests, o.n), max(0, res.requests-o.n))
	if !res.complete {
		s += fmt.Sprintf("; it was stopped at -timeout (%s) with %d/%d succeeded (jobs not finished by then count as not succeeded)",
			o.timeout, res.succeeded, res.n)
	}
	return s + "."
}

// text is what the command prints.
func (r tokensReport) text() string { return sectionText(tableHeader, r.rows(), r.notes()) }

// markdown is the section written between the tokens markers.
func (r tokensReport) markdown() string {
	return sectionMarkdown("tokens: a burst of long prompts against token limits", r.command, r.date, r.machine, tableHeader, r.rows(), r.notes())
}

// thousands renders n with commas: 40000 → "40,000".
func thousands(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
