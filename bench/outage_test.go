package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

func TestRun_Outage(t *testing.T) {
	t.Parallel()
	t.Run("BadFlag", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		require.ErrorContains(t, run(context.Background(), []string{"outage", "-threshold", "0"}, &out, &errOut), "-threshold: must be at least 1")
		require.Empty(t, out.String())
	})
	t.Run("UnknownRow", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"outage", "-only", "asynq,backoff8"}, &out, &errOut)
		require.ErrorContains(t, err, `unknown row "backoff8"`)
		require.ErrorContains(t, err, "retry-after8")
	})
	t.Run("InUsage", func(t *testing.T) {
		t.Parallel()
		var out, errOut bytes.Buffer
		require.NoError(t, run(context.Background(), []string{"help"}, &out, &errOut))
		require.Contains(t, out.String(), "outage")
	})
}

func TestParseOutageFlags(t *testing.T) {
	t.Parallel()
	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		o, err := parseOutageFlags(nil, io.Discard)
		require.NoError(t, err)
		require.Equal(t, 200, o.n)
		require.Equal(t, 20*time.Second, o.outage)
		require.InDelta(t, 50.0, o.capacity, 0)
		require.InDelta(t, 25.0, o.rate, 0)
		require.Equal(t, 4, o.workers)
		require.Equal(t, 2*time.Second, o.cooldown)
		require.Equal(t, 3, o.threshold)
		require.Equal(t, 2800*time.Millisecond, o.maxCooldown)
		require.Equal(t, 3*time.Minute, o.timeout)
		require.Empty(t, o.write)
		require.Equal(t, 6*time.Second, o.drain())
		require.Equal(t, 9*time.Second, o.outageMaxLag())
		require.Equal(t, []string{"asynq", "retry-after8", "llmq"}, rowIDs(outageRows(o)))
	})
	t.Run("DrainIsZeroWhenTheBucketHoldsAll", func(t *testing.T) {
		t.Parallel()
		o, err := parseOutageFlags([]string{"-n", "40"}, io.Discard)
		require.NoError(t, err)
		require.Equal(t, time.Duration(0), o.drain())
		require.Equal(t, 3*time.Second, o.outageMaxLag())
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "0"}, "-n: must be at least 1"},
		{[]string{"-outage", "0s"}, "-outage: must be positive"},
		{[]string{"-capacity", "0"}, "-capacity: must be at least 1"},
		{[]string{"-rate", "0"}, "-rate: must be positive"},
		{[]string{"-workers", "0"}, "-workers: must be at least 1"},
		{[]string{"-cooldown", "0s"}, "-cooldown: must be at least 1ms"},
		{[]string{"-threshold", "0"}, "-threshold: must be at least 1"},
		{[]string{"-timeout", "20s"}, "-timeout: must be longer than -outage"},
		{[]string{"extra"}, "unexpected arguments: extra"},
	} {
		t.Run("Invalid"+tc.args[0], func(t *testing.T) {
			t.Parallel()
			_, err := parseOutageFlags(tc.args, io.Discard)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestOutageChecks(t *testing.T) {
	t.Parallel()
	drain := 6 * time.Second
	good := outageResult{result: result{name: "llmq", n: 200, succeeded: 200, requests: 210, complete: true, last: ms(28500)},
		duringOutage: 8, recovery: 20 * time.Second, judged: true}
	passes := func(cs []outageCheck) []bool {
		out := make([]bool, len(cs))
		for i, c := range cs {
			out[i] = c.pass
		}
		return out
	}
	t.Run("Met", func(t *testing.T) {
		t.Parallel()
		cs := outageChecks(good, 200, drain)
		require.Equal(t, []bool{true, true, true, true}, passes(cs))
		require.Equal(t, "200/200 succeeded", cs[0].what)
		require.Equal(t, "provider requests during the outage ≤ 10", cs[1].what)
		require.Equal(t, "8", cs[1].got)
		require.Equal(t, "requests per success ≤ 1.1", cs[2].what)
		require.Equal(t, "1.05", cs[2].got)
		require.Equal(t, "last result ≤ recovery + drain 6.00 s + 3.00 s = recovery + 9.00 s", cs[3].what)
		require.Equal(t, "recovery + 8.50 s", cs[3].got)
		require.Equal(t, "PASS", outageVerdict(good, 200, drain))
	})
	t.Run("AtTheLimits", func(t *testing.T) {
		t.Parallel()
		r := good
		r.duringOutage, r.requests, r.last = 10, 220, 29*time.Second
		require.Equal(t, []bool{true, true, true, true}, passes(outageChecks(r, 200, drain)))
	})
	t.Run("MissedEverywhere", func(t *testing.T) {
		t.Parallel()
		r := good
		r.succeeded, r.duringOutage, r.requests, r.last = 190, 11, 220, ms(29001)
		cs := outageChecks(r, 200, drain)
		require.Equal(t, []bool{false, false, false, false}, passes(cs))
		require.Equal(t, "190/200", cs[0].got)
		require.Equal(t, "1.16", cs[2].got)
		require.Equal(t, "FAIL", outageVerdict(r, 200, drain))
	})
	t.Run("TimedOut", func(t *testing.T) {
		t.Parallel()
		r := good
		r.complete, r.last = false, 3*time.Minute
		cs := outageChecks(r, 200, drain)
		require.False(t, cs[3].pass)
		require.Equal(t, "recovery + > 160.00 s", cs[3].got)
	})
	t.Run("NothingSucceeded", func(t *testing.T) {
		t.Parallel()
		r := good
		r.succeeded, r.requests = 0, 0
		cs := outageChecks(r, 200, drain)
		require.False(t, cs[2].pass, "no success cannot meet a per-success target")
		require.Equal(t, "n/a", cs[2].got)
	})
	t.Run("VerdictOnlyForTheJudgedRow", func(t *testing.T) {
		t.Parallel()
		r := good
		r.judged = false
		require.Empty(t, outageVerdict(r, 200, drain))
		r.judged, r.err = true, errors.New("worker-1 exited early")
		require.Equal(t, "FAIL", outageVerdict(r, 200, drain))
	})
}

func TestOutageCells(t *testing.T) {
	t.Parallel()
	drain := 6 * time.Second
	r := outageResult{result: result{name: "llmq", n: 200, succeeded: 200, requests: 219, complete: true, last: ms(27550)},
		duringOutage: 19, overloaded: 19, recovery: 20 * time.Second, judged: true}
	require.Equal(t, []string{"llmq", "200/200", "19", "19", "0", "219", "1.09", "7.55 s", "FAIL"}, outageCells(r, 200, drain))
	gaveUp := outageResult{result: result{name: "seed", n: 200, requests: 1600, tooMany: 1200, complete: true, last: ms(15000)},
		duringOutage: 1600, overloaded: 400, recovery: 20 * time.Second}
	require.Equal(t, []string{"seed", "0/200", "1600", "400", "1200", "1600", "n/a", "-5.00 s", ""}, outageCells(gaveUp, 200, drain))
	failed := outageResult{result: result{name: "llmq", n: 200, err: errors.New("boom")}, judged: true}
	require.Equal(t, []string{"llmq", "error", "", "", "", "", "", "", "FAIL"}, outageCells(failed, 200, drain))
}

func TestOutageReport(t *testing.T) {
	t.Parallel()
	o, err := parseOutageFlags(nil, io.Discard)
	require.NoError(t, err)
	rep := outageReport{opts: o, command: "go run . outage -write docs/benchmarks.md",
		date: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC), machine: "linux/amd64",
		results: []outageResult{
			{result: result{name: "asynq, default retry", n: 200, succeeded: 200, requests: 900, complete: true, last: time.Minute,
				note: "asynq note"}, duringOutage: 200, recovery: 20 * time.Second},
			{result: result{name: "llmq", n: 200, succeeded: 200, requests: 219, complete: true, last: ms(27550)},
				duringOutage: 19, recovery: 20 * time.Second, judged: true},
		}}
	md := rep.markdown()
	require.True(t, strings.HasPrefix(md, "## outage: "))
	require.Contains(t, md, "`go run . outage -write docs/benchmarks.md` — 2026-05-01, linux/amd64.")
	require.Contains(t, md, "| strategy | succeeded | requests during outage |")
	require.Contains(t, md, "- asynq note\n")
	require.Contains(t, md, "provider requests during the outage ≤ 10: FAIL (19)")
	require.Contains(t, md, "requests per success ≤ 1.1: PASS (1.09)")
	require.Contains(t, md, "= recovery + 9.00 s: PASS (recovery + 7.55 s)")
	require.Contains(t, rep.text(), "llmq")

	doc, err := replaceSection("# Benchmarks\n\n<!-- herd:begin -->\nherd\n<!-- herd:end -->\n", outageBegin, outageEnd, md)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(doc, "# Benchmarks\n\n<!-- herd:begin -->\nherd\n<!-- herd:end -->\n\n<!-- outage:begin -->\n## outage"))
	require.True(t, strings.HasSuffix(doc, "<!-- outage:end -->\n"))
}

func TestSimRecorder(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	sim := llmsim.New(llmsim.Config{})
	rec := newSimRecorder(sim)
	var offset atomic.Int64 // the clock, as an offset from t0; set before each request
	rec.now = func() time.Time { return t0.Add(time.Duration(offset.Load())) }
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	c := newSimClient(srv.URL, "sk-test", 1)
	t.Cleanup(c.close)

	offset.Store(int64(-time.Second))
	require.Equal(t, http.StatusOK, c.call(context.Background(), 0).status)
	rec.begin(t0, t0.Add(20*time.Second))
	require.NoError(t, sim.SetFaults(llmsim.Faults{OverloadedFor: time.Hour}))
	offset.Store(int64(1500 * time.Millisecond))
	require.Equal(t, 529, c.call(context.Background(), 1).status)
	offset.Store(int64(20*time.Second - time.Nanosecond))
	require.Equal(t, 529, c.call(context.Background(), 2).status)
	require.NoError(t, sim.SetFaults(llmsim.Faults{}))
	offset.Store(int64(20 * time.Second))
	require.Equal(t, http.StatusOK, c.call(context.Background(), 3).status)
	resp, err := http.Get(srv.URL + "/_sim/stats")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())

	reqs, recovery := rec.snapshot()
	require.Equal(t, 20*time.Second, recovery)
	require.Equal(t, []simRequest{
		{at: 0, duringOutage: true, status: 200}, // before begin: no start to measure from
		{at: 1500 * time.Millisecond, duringOutage: true, status: 529},
		{at: 20*time.Second - time.Nanosecond, duringOutage: true, status: 529},
		{at: 20 * time.Second, duringOutage: false, status: 200},
	}, reqs, "control requests are not recorded; the recovery instant itself is after the outage")
}

func TestSimRecorder_Aborted(t *testing.T) {
	t.Parallel()
	rec := newSimRecorder(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	rec.begin(time.Now(), time.Now().Add(time.Hour))
	func() {
		defer func() { require.Equal(t, http.ErrAbortHandler, recover()) }()
		rec.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/v1/messages", nil))
	}()
	reqs, _ := rec.snapshot()
	require.Len(t, reqs, 1)
	require.Equal(t, llmsim.StatusClientClosed, reqs[0].status)
	require.True(t, reqs[0].duringOutage)
}

// TestRunOutageRow runs a small plain-client row through the real scenario plumbing: the outage
// starts at the first submit and ends by itself, and the recorder splits the requests there.
func TestRunOutageRow(t *testing.T) {
	t.Parallel()
	o, err := parseOutageFlags([]string{"-n", "4", "-outage", "300ms", "-capacity", "100", "-rate", "100", "-timeout", "30s"}, io.Discard)
	require.NoError(t, err)
	r := row{id: "test", name: "fixed 50ms, 100 attempts", run: func(ctx context.Context, e *rowEnv) ([]outcome, error) {
		return runStrategy(ctx, e, strategy{attempts: 100, delay: func(int, time.Duration, func() float64) time.Duration {
			return 50 * time.Millisecond
		}}), nil
	}}
	res := runOutageRow(context.Background(), o, r, io.Discard)
	require.NoError(t, res.err)
	require.Equal(t, 4, res.succeeded)
	require.True(t, res.complete)
	require.InDelta(t, float64(300*time.Millisecond), float64(res.recovery), float64(10*time.Millisecond))
	require.GreaterOrEqual(t, res.overloaded, 4, "every job's first call lands in the outage")
	require.GreaterOrEqual(t, res.duringOutage, res.overloaded, "every 529 arrived before the recovery instant")
	require.Equal(t, res.requests, res.overloaded+res.succeeded, "each job retries until it succeeds once")
	require.Positive(t, res.lag())
	require.Less(t, res.lag(), 5*time.Second)
	require.False(t, res.judged)
}
