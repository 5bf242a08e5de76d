package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// runArgs runs the command line args and returns its stdout, stderr and error.
func runArgs(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestRun(t *testing.T) {
	t.Parallel()
	_, stderr, err := runArgs()
	require.ErrorContains(t, err, "no scenario")
	require.Contains(t, stderr, "herd")

	_, _, err = runArgs("stampede")
	require.ErrorContains(t, err, `unknown scenario "stampede"`)

	stdout, _, err := runArgs("help")
	require.NoError(t, err)
	for _, e := range scenarios() {
		require.Contains(t, stdout, "  "+e.name+" ", "the usage lists every scenario")
	}
}

// Every scenario parses its defaults, refuses a stray argument and a bad shared flag, and
// checks its flags before it touches anything: nothing is printed on stdout.
func TestRun_FlagErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"herd", "-n", "0"}, "-n: must be at least 1"},
		{[]string{"herd", "-only", "no-retry,bogus"}, `unknown row "bogus"`},
		{[]string{"outage", "-threshold", "0"}, "-threshold: must be at least 1"},
		{[]string{"outage", "-timeout", "20s"}, "-timeout: must be longer than -outage"},
		{[]string{"outage", "-max-cooldown", "1s"}, "-max-cooldown: must be 0 or at least -cooldown"},
		{[]string{"tokens", "-capacity", "0"}, "-capacity: must be at least 1"},
		{[]string{"tokens", "-input-tpm", "1000"}, "-input-tpm: must be at least -input-tokens"},
		{[]string{"tokens", "-token-minute", "500ms"}, "-token-minute: must be at least 1s"},
		{[]string{"tokens", "-seed", "2"}, "flag provided but not defined: -seed"},
		{[]string{"chaos", "-grace", "0s"}, "-grace: must be positive"},
		{[]string{"chaos", "-flush-at", "-1s"}, "-flush-at: must not be negative"},
		{[]string{"chaos", "-redis-url", "redis://x"}, "flag provided but not defined: -redis-url"},
		{[]string{"throughput", "-runs", "0"}, "-runs: must be at least 1"},
		{[]string{"throughput", "-only", "sidekiq"}, `unknown row "sidekiq"`},
		{[]string{"rate", "-rate", "100,fast"}, `"fast" is not a positive number`},
		{[]string{"rate", "-n", "10"}, "flag provided but not defined: -n"},
		{[]string{"rate", "-baseline-bin", "/nonexistent"}, "-baseline-bin: no api binary in /nonexistent"},
		{[]string{"throughput", "-baseline-bin", "/nonexistent"}, "-baseline-bin: no api binary in /nonexistent"},
		{[]string{"backlog", "-n", "1500"}, "-n: at least 2000 jobs"},
		{[]string{"backlog", "now"}, "unexpected arguments: now"},
		{[]string{"retention", "-warmup", "0"}, "-warmup: at least 1 job"},
		{[]string{"retention", "-n", "1"}, "-n: at least 2 jobs"},
		{[]string{"retention", "-finished", "0"}, "-finished: must be at least 1"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			stdout, _, err := runArgs(tc.args...)
			require.ErrorContains(t, err, tc.want)
			require.Empty(t, stdout)
		})
	}
}

// parse parses args as scenario name's flags and returns the scenario and its shared flags.
func parse[S scenario](t *testing.T, name string, args ...string) (S, *shared) {
	t.Helper()
	for _, e := range scenarios() {
		if e.name == name {
			var s shared
			sc := e.new()
			fs := newFlagSet(name, io.Discard)
			sc.flags(fs, &s)
			require.NoError(t, fs.parse(args))
			return sc.(S), &s
		}
	}
	t.Fatalf("no scenario %s", name)
	panic("unreachable")
}

// The defaults are what docs/benchmarks.md's tables were measured with.
func TestScenarioDefaults(t *testing.T) {
	t.Parallel()
	h, s := parse[*herd](t, "herd")
	require.Equal(t, shared{n: 100, timeout: 3 * time.Minute, seed: 1, workers: 4, capacity: 20, rate: 10, bin: "../bin",
		dbURL: s.dbURL, redisURL: "redis://127.0.0.1:6379/0"}, *s)
	require.Equal(t, 8*time.Second, s.floor())
	require.Equal(t, "(100 − 20) / 10 = 8.00 s", s.floorText())
	s.n = 20
	require.Equal(t, "0 s (the bucket holds every job)", s.floorText())
	require.Equal(t, []string{"no-retry", "backoff3", "backoff8", "full-jitter8", "retry-after8", "asynq", "llmq-configured", "llmq-learned"},
		rowIDs(h.rows()))

	o, s := parse[*outage](t, "outage")
	require.Equal(t, 200, s.n)
	require.Equal(t, 6*time.Second, s.floor(), "the drain after the recovery: (200 − 50) / 25")
	require.Equal(t, []any{20 * time.Second, 2 * time.Second, 2800 * time.Millisecond, 3}, []any{o.outage, o.cooldown, o.maxCooldown, o.threshold})

	tk, s := parse[*tokensBench](t, "tokens")
	require.Equal(t, []any{100, 50.0, 50.0, 2000, 200, 150, 40000, 8000, 6 * time.Second},
		[]any{s.n, s.capacity, s.rate, tk.inputTokens, tk.maxTokens, tk.replyTokens, tk.inputTPM, tk.outputTPM, tk.tokenMinute})

	c, s := parse[*chaos](t, "chaos")
	require.Equal(t, []any{300, 3, 2, 15 * time.Second, time.Minute}, []any{s.n, s.workers, c.apis, c.submitOver, c.grace})

	tp, s := parse[*throughput](t, "throughput")
	require.Equal(t, []any{5000, 3, 2, 64, 16, 50}, []any{s.n, s.runs, s.workers, tp.o.clients, tp.o.conns, tp.o.warmup})
	require.Equal(t, 400, tp.o.concurrency())

	r, s := parse[*rate](t, "rate")
	require.Equal(t, []float64{100, 500}, r.rates)
	require.Equal(t, "httpfloor,llmq,serve", s.only)
	r, _ = parse[*rate](t, "rate", "-rate", "250")
	require.Equal(t, []float64{250}, r.rates)

	_, s = parse[*backlog](t, "backlog")
	require.Equal(t, []any{100_000, 25 * time.Minute}, []any{s.n, s.timeout})

	rt, s := parse[*retention](t, "retention")
	require.Equal(t, []any{10_000, 3, 2, 1_000_000, 10 * time.Minute, 50}, []any{s.n, s.runs, s.workers, rt.finished, s.timeout, rt.o.warmup})
}

func TestSelectIDs(t *testing.T) {
	t.Parallel()
	ids := []string{"a", "b", "c"}
	got, err := selectIDs(ids, "")
	require.NoError(t, err)
	require.Equal(t, ids, got)
	got, err = selectIDs(ids, " c, a")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "c"}, got, "in table order")
	_, err = selectIDs(ids, "a,z")
	require.ErrorContains(t, err, `-only: unknown row "z" (rows: a, b, c)`)
}

func TestChildEnv(t *testing.T) {
	t.Parallel()
	got := childEnv([]string{"PATH=/bin", "LLMQ_DATABASE_URL=postgres://elsewhere", "LLMQ_CONFIG=x.yaml", "LLMQ_REDIS_URL=redis://x", "HOME=/root"},
		[]string{"LLMQ_BENCH_SIM_KEY=sk"})
	require.Equal(t, []string{"PATH=/bin", "HOME=/root", "LLMQ_BENCH_SIM_KEY=sk"}, got)
}

// TestProcessEnv: -gomaxprocs reaches the llmq processes, over the bench's own GOMAXPROCS, and
// nothing is set at Go's default.
func TestProcessEnv(t *testing.T) {
	t.Parallel()
	base := []string{"PATH=/bin", "GOMAXPROCS=4"}
	require.Equal(t, []string{"PATH=/bin", "GOMAXPROCS=4", "LLMQ_BENCH_SIM_KEY=sk"},
		stackConfig{apiKey: "sk"}.processEnv(base))
	require.Equal(t, []string{"PATH=/bin", "GOMAXPROCS=4", "LLMQ_BENCH_SIM_KEY=sk", "GOMAXPROCS=1"},
		stackConfig{apiKey: "sk", gomaxprocs: 1}.processEnv(base), "the last value is the one a process gets")
	require.Nil(t, gomaxprocsNote(0))
	require.Equal(t, []string{"Each llmq process ran with GOMAXPROCS=1 (-gomaxprocs), not Go's default (the machine's cores)."}, gomaxprocsNote(1))
}
