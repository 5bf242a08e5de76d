package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// stats is a simulator's counters for requests answered 200 or 429.
func stats(requests, tooMany int) llmsim.Stats {
	return llmsim.Stats{Requests: requests, ByStatus: map[int]int{200: requests - tooMany, 429: tooMany}}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	r := summarize([]outcome{
		{done: true, ok: true, latency: ms(100), at: ms(110)},
		{done: true, ok: false, latency: ms(900), at: ms(950)},
		{done: true, ok: true, latency: ms(300), at: ms(320)},
	}, time.Minute)
	require.Equal(t, []int{3, 2}, []int{r.n, r.succeeded})
	require.Equal(t, []time.Duration{ms(100), ms(300), ms(950)}, []time.Duration{r.p50, r.p95, r.last}, "the last outcome counts, failures included")
	require.True(t, r.complete)

	r = summarize([]outcome{{done: true, ok: true, latency: ms(100), at: ms(100)}, {}}, time.Minute)
	require.False(t, r.complete)
	require.Equal(t, "> 60.00 s", r.lastText(), "a job without an outcome: the row timed out")
}

func TestTarget_Checks(t *testing.T) {
	t.Parallel()
	configured := target{maxRatio: 1.05, exactRequests: true, no429: true}
	learned := target{maxRatio: 1.15, maxPerSuccess: 1.1}
	floor := 8 * time.Second
	good := result{n: 100, succeeded: 100, stats: stats(100, 0), complete: true, last: ms(8300)}
	require.Equal(t, "PASS", verdict(configured.checks(good, floor)))
	require.Equal(t, "llmq: succeeded 100/100 (target 100/100), last result 8.30 s (target ≤ 1.05 × floor = 8.40 s), "+
		"provider requests 100 (target = 100), 429s 0 (target 0): PASS.", checksNote("llmq", configured.checks(good, floor)))

	bad := good
	bad.succeeded, bad.stats, bad.last = 97, stats(130, 30), ms(8500)
	require.Equal(t, "llmq: succeeded 97/100 (target 100/100), last result 8.50 s (target ≤ 1.05 × floor = 8.40 s), "+
		"provider requests 130 (target = 100), 429s 30 (target 0): FAIL (succeeded, last result, provider requests, 429s).",
		checksNote("llmq", configured.checks(bad, floor)))

	edge := good
	edge.stats, edge.last = stats(110, 10), ms(9200)
	require.Equal(t, "PASS", verdict(learned.checks(edge, floor)), "1.10 requests per success and 1.15 × floor pass; 429s are not judged")
	edge.stats = stats(111, 11)
	require.Equal(t, "FAIL", verdict(learned.checks(edge, floor)))
	edge.stats, edge.last = stats(110, 10), ms(9201)
	require.Equal(t, "FAIL", verdict(learned.checks(edge, floor)))

	timedOut := good
	timedOut.complete, timedOut.last = false, time.Minute
	require.Equal(t, "FAIL", verdict(configured.checks(timedOut, floor)), "a row that timed out misses the time target")
	require.Equal(t, "FAIL", verdict(configured.checks(result{n: 100, err: errors.New("api exited")}, floor)))
	require.Len(t, learned.checks(good, 0), 2, "no floor (the bucket holds every job): the time is not judged")
}

func TestBurstCells(t *testing.T) {
	t.Parallel()
	floor := 8 * time.Second
	j := targetJudge(floor)
	r := result{name: "llmq (limit configured)", n: 100, succeeded: 100, stats: stats(100, 0), p50: ms(4040), p95: ms(7640),
		last: ms(8040), complete: true, target: &target{maxRatio: 1.05, exactRequests: true, no429: true}}
	require.Equal(t, []string{"llmq (limit configured)", "100/100", "100", "0", "1.00", "4.04 s", "7.64 s", "8.04 s", "1.00", "PASS"},
		burstCells(r, floor, j))
	none := result{name: "no retry", n: 100, stats: stats(100, 100), complete: true}
	require.Equal(t, []string{"no retry", "0/100", "100", "100", "n/a", "n/a", "n/a", "0.00 s", "0.00", ""}, burstCells(none, floor, j))
	timedOut := result{name: "asynq", n: 100, succeeded: 90, stats: stats(300, 210), last: 3 * time.Minute}
	require.Equal(t, []string{"> 180.00 s", "> 22.50"}, burstCells(timedOut, floor, j)[7:9])
	failed := result{id: "x", name: "x", err: errors.New("worker-1 exited early\nlog tail")}
	require.Equal(t, "error", burstCells(failed, floor, j)[1])
	notes, ids := burstNotes([]result{none, failed, r}, j)
	require.Equal(t, []string{"x"}, ids)
	require.Equal(t, "x: failed: worker-1 exited early", notes[0], "only the first line of the error")
	require.True(t, strings.HasPrefix(notes[1], "llmq (limit configured): succeeded 100/100"))
}

// The arrivals before the deadline are counted, control requests are not, and before a
// deadline is set every request counts.
func TestArrivals(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	var offset atomic.Int64
	a := &arrivals{next: http.NotFoundHandler(), now: func() time.Time { return t0.Add(time.Duration(offset.Load())) }}
	serve := func(path string, at time.Duration) {
		offset.Store(int64(at))
		a.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, path, nil))
	}
	serve("/v1/messages", -time.Second)
	a.until(t0.Add(20 * time.Second))
	serve("/v1/messages", 19*time.Second)
	serve("/_sim/stats", 19*time.Second)
	serve("/v1/messages", 20*time.Second)
	require.Equal(t, 2, a.before(), "the recovery instant itself is after the outage")
}

// A row runs through the real plumbing: the outage starts at the first submit and ends on the
// simulator's clock, which the test moves past it once every job's first call has been answered
// in it (a wall-clock outage let a loaded machine's late first call land after it); the requests
// before the recovery are counted, and each job retries until it succeeds once.
func TestBurst_RunRow(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	var offset atomic.Int64
	clock := func() time.Time { return t0.Add(time.Duration(offset.Load())) }
	s := &shared{n: 4, timeout: 30 * time.Second, seed: 1}
	b := burst{shared: s, sim: llmsim.Config{Capacity: 100, RefillPerSecond: 100, Now: clock}, outage: 300 * time.Millisecond}
	var wrapped atomic.Bool
	var mu sync.Mutex
	firsts := map[string]bool{} // the jobs whose call was answered, by body
	row := burstRow{id: "test", name: "fixed 50ms, 100 attempts",
		wrap: func(h http.Handler) http.Handler {
			wrapped.Store(true)
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, err := io.ReadAll(r.Body)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
				h.ServeHTTP(w, r)
				if r.URL.Path != "/v1/messages" {
					return
				}
				mu.Lock()
				firsts[string(body)] = true
				if len(firsts) == s.n {
					offset.Store(int64(time.Second)) // the recovery
				}
				mu.Unlock()
			})
		},
		run: func(ctx context.Context, e *rowEnv) ([]outcome, error) {
			return runStrategy(ctx, e, strategy{attempts: 100, delay: func(int, time.Duration, func() float64) time.Duration {
				return 50 * time.Millisecond
			}}), nil
		}}
	res := b.runRow(context.Background(), func(string, ...any) {}, row)
	require.NoError(t, res.err)
	require.True(t, wrapped.Load())
	require.Equal(t, 4, res.succeeded)
	require.True(t, res.complete)
	overloaded := res.answered(529)
	require.GreaterOrEqual(t, overloaded, 4, "every job's first call lands in the outage")
	require.GreaterOrEqual(t, res.during, overloaded, "every 529 arrived before the recovery")
	require.Equal(t, res.requests(), overloaded+res.succeeded)

	failing := burstRow{id: "broken", name: "broken", run: func(context.Context, *rowEnv) ([]outcome, error) {
		return nil, errors.New("no stack")
	}}
	got := b.runRows(context.Background(), func(string, ...any) {}, []burstRow{failing})
	require.Len(t, got, 1)
	require.ErrorContains(t, got[0].err, "no stack")
}

func TestSelectRows(t *testing.T) {
	t.Parallel()
	rows := []burstRow{{id: "a"}, {id: "b"}, {id: "c"}}
	got, err := selectRows(rows, "c,a")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "c"}, rowIDs(got))
	_, err = selectRows(rows, "d")
	require.ErrorContains(t, err, `unknown row "d"`)
}

// The burst reports render their results against their targets.
func TestBurstReports(t *testing.T) {
	t.Parallel()
	h, _ := parse[*herd](t, "herd")
	h.results = []result{
		{id: "no-retry", name: "no retry", n: 100, succeeded: 20, stats: stats(100, 80), complete: true, last: ms(30)},
		{id: "llmq-configured", name: "llmq (limit configured)", n: 100, succeeded: 100, stats: stats(100, 0), complete: true,
			last: ms(8230), p50: ms(3180), p95: ms(7710), target: h.rows()[6].target},
	}
	rep := h.report()
	require.Empty(t, rep.failed)
	md := rep.markdown(head{command: "go run . herd", date: time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC), machine: "m"})
	require.Contains(t, md, "| llmq (limit configured) | 100/100 | 100 | 0 | 1.00 | 3.18 s | 7.71 s | 8.23 s | 1.03 | PASS |")
	require.Contains(t, md, "- 100 jobs at once; bucket of 20 refilling 10/s; floor = (100 − 20) / 10 = 8.00 s; 4 llmq workers.")

	o, _ := parse[*outage](t, "outage")
	o.results = []result{
		{id: "asynq", name: "asynq, default retry", n: 200, succeeded: 200, stats: stats(400, 149), during: 200, complete: true, last: ms(45730)},
		{id: outageLLMQ, name: "llmq", n: 200, succeeded: 200, stats: llmsim.Stats{Requests: 210, ByStatus: map[int]int{200: 200, 529: 10}},
			during: 10, complete: true, last: ms(28200)},
	}
	rep = o.report()
	require.Equal(t, []string{"llmq", "200/200", "10", "10", "0", "210", "1.05", "8.20 s", "PASS"}, rep.tables[0].rows[1])
	require.Equal(t, "", rep.tables[0].rows[0][8], "only llmq is judged")
	require.Contains(t, rep.notes, "llmq: succeeded 200/200 (target 200/200), requests during the outage 10 (target ≤ 10), "+
		"requests per success 1.05 (target ≤ 1.1), recovery → last result 8.20 s (target ≤ drain 6.00 s + 3.00 s): PASS.")
	o.results[1].during, o.results[1].last = 11, ms(29100)
	require.Contains(t, strings.Join(o.report().notes, "\n"), "FAIL (requests during the outage, recovery → last result)")

	tk, _ := parse[*tokensBench](t, "tokens")
	full := func(r result) result {
		r.stats.InputTokens, r.stats.OutputTokens = 200000, 15000
		return r
	}
	rows := tk.rows()
	tk.results = []result{
		full(result{id: "llmq-requests", name: "llmq, request limit only", n: 100, succeeded: 100, stats: stats(444, 344), complete: true, last: ms(24820)}),
		full(result{id: "llmq-known", name: "llmq, token limits known", n: 100, succeeded: 100, stats: stats(100, 0), complete: true,
			last: ms(24380), target: rows[1].target}),
		{id: "llmq-learned", name: "llmq, token limits learned", n: 100, succeeded: 100, stats: stats(100, 0), complete: true,
			last: ms(29000), target: rows[2].target},
	}
	rep = tk.report()
	require.Equal(t, []string{"", "PASS", "FAIL"}, []string{rep.tables[0].rows[0][9], rep.tables[0].rows[1][9], rep.tables[0].rows[2][9]})
	notes := strings.Join(rep.notes, "\n")
	require.Contains(t, notes, "requests 1.00 s, input tokens 24.00 s, output tokens 5.25 s; floor 24.00 s (input tokens).")
	require.Contains(t, notes, "last result 29.00 s (target ≤ 1.15 × floor = 27.60 s)")
	require.Contains(t, notes, "llmq, token limits learned: the simulator charged 0 input and 0 output tokens, not the floor's 200,000 and 15,000.")
	require.NotContains(t, notes, "llmq, token limits known: the simulator charged")
}
