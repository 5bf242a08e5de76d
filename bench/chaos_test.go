package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
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

// echoServer answers every line with the same line until the client goes away.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// roundTrip writes a line on c and reads one back, within a second.
func roundTrip(c net.Conn, line string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func TestPGProxy(t *testing.T) {
	t.Parallel()
	p, err := startPGProxy(echoServer(t))
	require.NoError(t, err)
	defer p.close()

	before, err := net.Dial("tcp", p.addr())
	require.NoError(t, err)
	defer before.Close()
	got, err := roundTrip(before, "hello")
	require.NoError(t, err)
	require.Equal(t, "hello", got, "up: the proxy forwards both ways")

	require.Equal(t, 1, p.setDown(true), "the live connection is cut")
	_, err = roundTrip(before, "still there?")
	require.Error(t, err, "a connection open when Postgres went down is dead")
	// The reset may reach the client while it is still connecting, or on its first read.
	if during, err := net.Dial("tcp", p.addr()); err == nil {
		_, err = roundTrip(during, "anyone?")
		during.Close()
		require.Error(t, err, "a new connection is reset while down")
	}
	require.Eventually(t, func() bool { return p.refusedCount() == 1 }, 30*time.Second, 5*time.Millisecond)

	require.Zero(t, p.setDown(false))
	after, err := net.Dial("tcp", p.addr())
	require.NoError(t, err)
	defer after.Close()
	got, err = roundTrip(after, "back")
	require.NoError(t, err)
	require.Equal(t, "back", got, "up again: new connections get through")
}

func TestChaosCallLog(t *testing.T) {
	t.Parallel()
	var bodies atomic.Value
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies.Store(string(b))
		switch {
		case strings.Contains(string(b), "abort"):
			panic(http.ErrAbortHandler)
		case strings.Contains(string(b), "job-2\""):
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			_, _ = io.WriteString(w, "{}")
		}
	})
	l := newChaosCallLog(next, "t1")
	srv := httptest.NewServer(l)
	defer srv.Close()
	post := func(body string) {
		resp, err := http.Post(srv.URL+"/v1/messages", "application/json", strings.NewReader(body))
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	post(string(chaosBody("t1", 7)))
	require.Equal(t, string(chaosBody("t1", 7)), bodies.Load(), "the simulator gets the body unchanged")
	post(string(chaosBody("t1", 2)))
	post(string(chaosBody("t1", 12)) + " abort")
	post(string(chaosBody("other-run", 3)))
	post(`{"no":"marker"}`)

	calls, unmarked := l.snapshot()
	require.Equal(t, 2, unmarked, "another run's marker and no marker")
	require.Len(t, calls, 3)
	require.Equal(t, []int{7, 2, 12}, []int{calls[0].job, calls[1].job, calls[2].job}, "job-1 is not read as job-12, nor job-12 as job-1")
	require.Equal(t, []int{http.StatusOK, http.StatusTooManyRequests, llmsim.StatusClientClosed},
		[]int{calls[0].status, calls[1].status, calls[2].status})
	for _, c := range calls {
		require.False(t, c.ended.Before(c.arrived))
	}
}

func TestChaosClient_Submit(t *testing.T) {
	t.Parallel()
	var tries atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := tries.Add(1)
		switch key := r.Header.Get("Idempotency-Key"); {
		case key == "refused":
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"error":{"type":"invalid_json","message":"no"}}`)
		case n == 1:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, `{"id":"job-1"}`)
		}
	}))
	defer srv.Close()
	c := &chaosClient{hc: srv.Client(), apiURLs: []string{srv.URL, srv.URL}, start: time.Now(), rand: func() float64 { return 0 }}

	s := c.submit(context.Background(), 0, "k", []byte(`{}`), 3)
	require.True(t, s.accepted)
	require.True(t, s.replayed, "a 200 after a 503 means the first try had been committed")
	require.Equal(t, "job-1", s.id)
	require.Len(t, s.answers, 2)
	require.Equal(t, http.StatusServiceUnavailable, s.answers[0].status)
	require.Equal(t, "0", s.answers[0].retryAfter)
	require.Equal(t, []int{0, 1}, []int{s.answers[0].api, s.answers[1].api}, "tries alternate between the apis")

	s = c.submit(context.Background(), 0, "refused", []byte(`{}`), 3)
	require.False(t, s.accepted)
	require.Contains(t, s.giveUp, "refused with 400")
}

func TestSummarizeChaos(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	ptr := func(t time.Time) *time.Time { return &t }
	clean := func() chaosResult {
		return chaosResult{
			tag: "t", start: start, allTerminal: true, observedUntil: 45 * time.Second, lastFaultEnd: 10 * time.Second,
			faults: []chaosFault{{what: "Redis FLUSHALL", start: 5 * time.Second, end: 5 * time.Second}},
			submits: []chaosSubmit{
				{key: "k0", id: "a", accepted: true, answers: []chaosAnswer{{status: 202}}},
				{key: "k1", id: "b", accepted: true, replayed: true, answers: []chaosAnswer{{status: 503, retryAfter: "5"}, {status: 200}}},
			},
			rows: []chaosRow{
				{id: "a", key: "k0", status: "succeeded", hasResult: true, finishedAt: ptr(at(6)), prompt: chaosMarker("t", 0), recorded: 1},
				{id: "b", key: "k1", status: "succeeded", hasResult: true, finishedAt: ptr(at(12)), prompt: chaosMarker("t", 1), recorded: 2},
			},
			calls: []chaosCall{
				{job: 0, arrived: at(4), ended: at(6), status: 200},
				{job: 1, arrived: at(8), ended: at(9), status: 429},
				{job: 1, arrived: at(10), ended: at(11.9), status: 200},
			},
		}
	}
	t.Run("Clean", func(t *testing.T) {
		t.Parallel()
		c, _ := parse[*chaos](t, "chaos") // each subtest its own: they run in parallel and set c.res
		r := clean()
		s := summarizeChaos(r)
		require.Equal(t, 2, s.accepted)
		require.Equal(t, 1, s.replayed)
		require.Equal(t, 2, s.succeeded)
		require.Equal(t, 2, s.callsMax)
		require.InDelta(t, 1.5, s.callsMean, 1e-9)
		require.Equal(t, 1, s.tooMany)
		require.Zero(t, s.lost())
		require.Empty(t, s.afterSuccess)
		require.Len(t, s.recoveries, 1)
		require.Equal(t, time.Second, s.recoveries[0].after, "the next success after the flush at 5 s came at 6 s")
		c.res = r
		rep := c.report()
		require.Contains(t, rep.notes, "Verdict: PASS.", "%s", rep.text())
	})
	t.Run("EveryFailure", func(t *testing.T) {
		t.Parallel()
		c, _ := parse[*chaos](t, "chaos")
		r := clean()
		r.submits = append(r.submits,
			chaosSubmit{key: "k2", id: "c", accepted: true, answers: []chaosAnswer{{status: 500}, {status: 503}, {status: 202}}},
			chaosSubmit{key: "k3", id: "gone", accepted: true, answers: []chaosAnswer{{status: 202}}},
			chaosSubmit{key: "k4", giveUp: "refused with 400", answers: []chaosAnswer{{status: 400}}},
		)
		r.rows = append(r.rows,
			chaosRow{id: "c", key: "k2", status: "running", prompt: chaosMarker("t", 2)},
			chaosRow{id: "d", key: "", status: "succeeded", hasResult: true, finishedAt: ptr(at(7)), prompt: chaosMarker("t", 0)},
		)
		r.calls = append(r.calls, chaosCall{job: 0, arrived: at(6.5), ended: at(7), status: 200})
		r.allTerminal, r.pending = false, []string{"c", "gone"}
		r.exits = []chaosExit{
			{name: "worker-2.4", at: at(12), err: errors.New("exit status 1"), tail: "log line\nworker: connect to postgres: refused"},
			{name: "worker-2.5", at: at(12.5), err: errors.New("exit status 1"), tail: "worker: connect to postgres: refused again"},
		}
		s := summarizeChaos(r)
		require.Equal(t, 4, s.accepted)
		require.Equal(t, 1, s.gaveUp)
		require.Equal(t, 1, s.missing, "job k3's 202 names a job that is not stored")
		require.Equal(t, 1, s.nonTerminalAtGrace)
		require.Equal(t, 2, s.lost())
		require.Equal(t, 1, s.extraRows, "a second row with job 0's prompt")
		require.Equal(t, 1, s.extraResults)
		require.Equal(t, 1, s.orphans)
		require.Len(t, s.afterSuccess, 1, "job 0 succeeded at 6 s and was called at 6.5 s")
		require.Equal(t, 1, s.paidTwice)
		require.Equal(t, 1, s.answers[500])
		require.Equal(t, 1, s.noRetryAfter)
		c.res = r
		text := c.report().text()
		for _, want := range []string{"Verdict: FAIL.", "Calls after success: job 0 (a)", "1 submits were never accepted",
			"2 processes exited on their own", "2 (missing 1, not terminal 1)"} {
			require.Contains(t, text, want)
		}
	})
}
