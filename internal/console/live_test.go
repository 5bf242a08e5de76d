package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/httpserve/httpservetest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/operator"
)

// liveBundle is setup with a running job event listener and a fast overview.
func liveBundle(t *testing.T) (*testBundle, *client) {
	b, c, _ := liveHandler(t)
	return b, c
}

func liveHandler(t *testing.T) (*testBundle, *client, *console.Handler) {
	t.Helper()
	b := setup(t)
	l := b.listener(t)
	// The clock stands still: a recomputation measures 0 s and the next waits LiveInterval, not
	// 20 times what a loaded machine took (a half-second count would hold the next for 10 s).
	stopped := time.Now()
	c, h := b.serve(t, func(cfg *console.Config) {
		cfg.Listener, cfg.LiveInterval, cfg.Now = l, 20*time.Millisecond, func() time.Time { return stopped }
	})
	return b, c, h
}

// listener runs a job event listener on b's database until the test ends.
func (b *testBundle) listener(t *testing.T) *jobs.Listener {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := jobs.NewListener(jobs.ListenerConfig{ConnConfig: b.jobs.Pool.Config().ConnConfig.Copy()})
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return l
}

// serve replaces b's console by one on b's stores with change made to its config, and returns a
// client logged in to it and its handler.
func (b *testBundle) serve(t *testing.T, change func(*console.Config)) (*client, *console.Handler) {
	t.Helper()
	return b.serveOn(t, change, nil)
}

// serveOn is serve with the server's listener wrapped by listener (when not nil).
func (b *testBundle) serveOn(t *testing.T, change func(*console.Config),
	listener func(net.Listener) net.Listener) (*client, *console.Handler) {
	t.Helper()
	cfg := console.Config{Pool: b.jobs.Pool, Jobs: b.jobs.Store, Redis: b.rdb, RedisPrefix: b.prefix}
	change(&cfg)
	h, err := console.New(cfg)
	require.NoError(t, err)
	b.srv = httptest.NewUnstartedServer(openapitest.Handler(t, h))
	if listener != nil {
		b.srv.Listener = listener(b.srv.Listener)
	}
	b.srv.Start()
	t.Cleanup(b.srv.Close)
	return b.login(t), h
}

// stream reads one event stream's events of one name.
type stream struct {
	events chan string
	ended  chan struct{} // closed when the server ended the stream
	last   string        // the name of the last event read; set before ended is closed
	header http.Header   // the answer's
}

func (c *client) stream(t *testing.T, path string, names ...string) *stream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	require.NoError(t, err)
	res, err := c.http.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	s := &stream{events: make(chan string, 100), header: res.Header}
	finished := make(chan struct{})
	s.ended = finished
	go func() {
		defer close(finished)
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		event := ""
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "event: "); ok {
				event, s.last = v, v
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok && slices.Contains(names, event) {
				s.events <- v
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		res.Body.Close()
		<-finished
	})
	return s
}

// next waits (at most 10 s) for the next event and decodes it into v.
func (s *stream) next(t *testing.T, v any) {
	t.Helper()
	select {
	case data := <-s.events:
		require.NoError(t, json.Unmarshal([]byte(data), v))
	case <-time.After(30 * time.Second):
		t.Fatal("no event within 30 s")
	}
}

func TestJobLive_FollowsTransitions(t *testing.T) {
	t.Parallel()
	b, c := liveBundle(t)
	job := b.jobs.Create(t, jobstestOpts())
	s := c.stream(t, "/console/api/jobs/"+job.ID+"/live", "job")
	var d struct {
		Job struct {
			Status jobs.Status `json:"status"`
		} `json:"job"`
		Attempts []jobs.AttemptRow `json:"attempts"`
		Events   []jobs.Event      `json:"events"`
	}
	s.next(t, &d)
	require.Equal(t, jobs.StatusQueued, d.Job.Status)
	require.Empty(t, d.Attempts)

	// Each transition, made elsewhere, arrives as a new state of the page.
	b.jobs.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	for d.Job.Status != jobs.StatusRetrying {
		s.next(t, &d)
	}
	require.Len(t, d.Attempts, 1)
	b.jobs.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
	for d.Job.Status != jobs.StatusDead {
		s.next(t, &d)
	}
	require.Len(t, d.Attempts, 2)
	require.Equal(t, jobs.StatusDead, d.Events[len(d.Events)-1].Type)
}

// TestJobLive_IDInCapitalsFollowsTransitions: an ID in capitals names the job (the page opens),
// and its page follows the job's transitions as the ID in lower case does. The keep-alive, which
// re-reads the job too, is an hour away: only the job's notifications can bring them.
func TestJobLive_IDInCapitalsFollowsTransitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.listener(t)
	c, _ := b.serve(t, func(cfg *console.Config) { cfg.Listener, cfg.KeepAlive = l, time.Hour })

	job := b.jobs.Create(t, jobstestOpts())
	s := c.stream(t, "/console/api/jobs/"+strings.ToUpper(job.ID)+"/live", "job")
	var d struct {
		Job struct {
			ID     string      `json:"id"`
			Status jobs.Status `json:"status"`
		} `json:"job"`
	}
	s.next(t, &d)
	require.Equal(t, job.ID, d.Job.ID)
	require.Equal(t, jobs.StatusQueued, d.Job.Status)
	b.jobs.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	// The attempt's start may arrive on its own (running) before its end (each page read
	// waits on next's deadline).
	for d.Job.Status != jobs.StatusRetrying {
		s.next(t, &d)
		require.Contains(t, []jobs.Status{jobs.StatusRunning, jobs.StatusRetrying}, d.Job.Status)
	}
}

func TestOverviewLive_CountsChange(t *testing.T) {
	t.Parallel()
	b, c := liveBundle(t)
	// Two consoles open: one recomputation serves both (its goroutine ends with the last
	// stream; goleak checks in TestMain).
	s1 := c.stream(t, "/console/api/overview/live", "overview")
	s2 := b.login(t).stream(t, "/console/api/overview/live", "overview")
	for _, s := range []*stream{s1, s2} {
		var ov console.Overview
		s.next(t, &ov)
		require.Equal(t, 0, ov.ByStatus[jobs.StatusQueued])
	}
	b.jobs.Create(t, jobstestOpts())
	for _, s := range []*stream{s1, s2} {
		var ov console.Overview
		s.next(t, &ov)
		require.Equal(t, 1, ov.ByStatus[jobs.StatusQueued], "sent because it changed")
	}
}

// TestOverviewLive_ASlowRecomputationWaitsLonger: the live overview's next recomputation waits
// 20 times the last one's duration, LiveInterval at the least: on a large backlog, whose counts
// take most of a second, an open console keeps a Postgres backend busy a twentieth of the time,
// not most of it. Here the clock says each recomputation took 10 s, so a change is not sent at
// the 20 ms interval (TestOverviewLive_CountsChange: it is, when recomputations are quick).
func TestOverviewLive_ASlowRecomputationWaitsLonger(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { // 5 s pass at each reading
		mu.Lock()
		defer mu.Unlock()
		now = now.Add(5 * time.Second)
		return now
	}
	c, _ := b.serve(t, func(cfg *console.Config) { cfg.LiveInterval, cfg.Now = 20*time.Millisecond, clock })
	s := c.stream(t, "/console/api/overview/live", "overview")
	var ov console.Overview
	s.next(t, &ov)
	require.Equal(t, 0, ov.ByStatus[jobs.StatusQueued])
	b.jobs.Create(t, jobstestOpts())
	select {
	case data := <-s.events:
		t.Fatalf("recomputed within a second of a recomputation that took 10 s: %s", data)
	case <-time.After(time.Second):
	}
}

// TestOverviewLive_SaysWhenItsFiguresAreStale: while the overview cannot be recomputed (Postgres
// does not answer), its streams say so with an "overview_stale" event, and the page stops calling
// its figures live; once a recomputation succeeds they get the figures again, changed or not.
// Before, the page kept showing the last figures as live for as long as the outage lasted.
func TestOverviewLive_SaysWhenItsFiguresAreStale(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, store := b.storeBehindProxy(t)
	stopped := time.Now()
	c, _ := b.serve(t, func(cfg *console.Config) {
		cfg.Jobs, cfg.LiveInterval, cfg.Now = store, 20*time.Millisecond, func() time.Time { return stopped }
	})
	s := c.stream(t, "/console/api/overview/live", "overview", "overview_stale")
	var ov console.Overview
	s.next(t, &ov)
	require.Equal(t, 0, ov.ByStatus[jobs.StatusQueued])

	proxy.Cut()
	var stale struct {
		Since *time.Time `json:"as_of"`
	}
	s.next(t, &stale)
	require.NotNil(t, stale.Since, "an overview_stale event, with the last good recomputation's time")
	require.True(t, stale.Since.Equal(stopped))

	proxy.Restore()
	var again map[string]json.RawMessage
	s.next(t, &again)
	require.Contains(t, again, "jobs_by_status", "the figures again, unchanged as they are")
}

// requireSessionEnd waits (at most 10 s) for the server to end s with a session_expired event.
func (s *stream) requireSessionEnd(t *testing.T) {
	t.Helper()
	select {
	case <-s.ended:
		require.Equal(t, "session_expired", s.last)
	case <-time.After(30 * time.Second):
		t.Fatal("the stream outlived its session")
	}
}

func TestLive_EndsWithItsSession(t *testing.T) {
	t.Parallel()
	b, c := liveBundle(t)
	other := b.login(t)
	job := b.jobs.Create(t, jobstestOpts())
	follow := func(c *client) (*stream, *stream) {
		j := c.stream(t, "/console/api/jobs/"+job.ID+"/live", "job")
		o := c.stream(t, "/console/api/overview/live", "overview")
		var v map[string]any
		j.next(t, &v)
		o.next(t, &v)
		return j, o
	}
	j1, o1 := follow(c)
	j2, o2 := follow(other)

	// A logout ends that session's open pages at their next pass, not the other session's.
	res, body := other.do(http.MethodPost, "/console/api/logout", nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	b.jobs.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	j2.requireSessionEnd(t)
	o2.requireSessionEnd(t)
	var d struct {
		Job struct {
			Status jobs.Status `json:"status"`
		} `json:"job"`
	}
	for d.Job.Status != jobs.StatusRetrying {
		j1.next(t, &d)
	}

	// Revoking the operator ends every page it has open, though no session was logged out.
	_, err := operator.NewStore(b.jobs.Pool, nil).Revoke(t.Context(), "alice")
	require.NoError(t, err)
	b.jobs.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
	j1.requireSessionEnd(t)
	o1.requireSessionEnd(t)
	select {
	case data := <-j1.events:
		require.NotContains(t, data, `"status":"dead"`, "a revoked operator's page was sent the job")
	default:
	}
}

func TestShutdown_EndsTheStreams(t *testing.T) {
	t.Parallel()
	b, c, h := liveHandler(t)
	job := b.jobs.Create(t, jobstestOpts())
	streams := []*stream{
		c.stream(t, "/console/api/overview/live", "overview"),
		c.stream(t, "/console/api/jobs/"+job.ID+"/live", "job"),
	}
	var v map[string]any
	for _, s := range streams {
		s.next(t, &v) // open and sending
	}
	h.Shutdown()
	h.Shutdown() // idempotent
	for _, s := range streams {
		select {
		case <-s.ended:
		case <-time.After(30 * time.Second):
			t.Fatal("a stream outlived Shutdown")
		}
	}
}

// TestJobLive_AFailedReadIsNotAnEnd: while Postgres does not answer the job's reads, the job
// page's stream says nothing (no "gone": the page would tell the operator the job was purged and
// stop following it) and follows the job again once Postgres is back.
func TestJobLive_AFailedReadIsNotAnEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, store := b.storeBehindProxy(t)
	// No listener: each keep-alive reads.
	c, _ := b.serve(t, func(cfg *console.Config) { cfg.Jobs, cfg.KeepAlive = store, 20*time.Millisecond })

	job := b.jobs.Create(t, jobstestOpts())
	s := c.stream(t, "/console/api/jobs/"+job.ID+"/live", "job")
	var d struct {
		Job struct {
			Status jobs.Status `json:"status"`
		} `json:"job"`
	}
	s.next(t, &d)
	require.Equal(t, jobs.StatusQueued, d.Job.Status)

	proxy.Cut()
	refused := proxy.Refused()
	require.Eventually(t, func() bool { return proxy.Refused() >= refused+3 }, 30*time.Second, 5*time.Millisecond,
		"the page's reads reach the cut proxy")
	select {
	case <-s.ended:
		t.Fatalf("the stream ended while Postgres did not answer, its last event %q", s.last)
	default:
	}
	b.jobs.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying}) // on the direct pool
	proxy.Restore()
	s.next(t, &d)
	require.Equal(t, jobs.StatusRetrying, d.Job.Status, "the page follows the job again")
}

// TestJobLive_APurgedJobIsGone: a job deleted while its page is open (retention, a purge) ends
// the page's stream with a "gone" event.
func TestJobLive_APurgedJobIsGone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, _ := b.serve(t, func(cfg *console.Config) { cfg.KeepAlive = 20 * time.Millisecond }) // no listener: each keep-alive reads
	job := b.jobs.Create(t, jobstestOpts())
	s := c.stream(t, "/console/api/jobs/"+job.ID+"/live", "job")
	var d struct{}
	s.next(t, &d)

	_, err := b.jobs.Pool.Exec(context.Background(), `DELETE FROM jobs WHERE id = $1`, job.ID)
	require.NoError(t, err)
	select {
	case <-s.ended:
		require.Equal(t, "gone", s.last)
	case <-time.After(30 * time.Second):
		t.Fatal("the stream outlived its job")
	}
}

// TestJobLive_APurgeIsSaidAtOnce: a dead letter purged while its page is open (the console's
// purge of a selection, ctl's purge by age) ends the page's stream with its "gone" event at once,
// not at the stream's next keep-alive (an hour away here): the purge announces the watched jobs it
// deletes on jobs.ChangesChannel, in its own statement.
func TestJobLive_APurgeIsSaidAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		purge func(ctx context.Context, s *jobs.Store, id string) error
	}{
		{"Selection", func(ctx context.Context, s *jobs.Store, id string) error {
			done, err := s.PurgeDeadIDs(ctx, []string{id})
			if err == nil && len(done) != 1 {
				err = fmt.Errorf("purged %v, not the job", done)
			}
			return err
		}},
		{"ByAge", func(ctx context.Context, s *jobs.Store, _ string) error {
			n, err := s.PurgeDead(ctx, time.Now().Add(time.Hour), nil)
			if err == nil && n != 1 {
				err = fmt.Errorf("purged %d jobs, not the job", n)
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			l := b.listener(t)
			c, _ := b.serve(t, func(cfg *console.Config) { cfg.Listener, cfg.KeepAlive = l, time.Hour })
			job := b.jobs.Create(t, jobstestOpts())
			b.jobs.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
			s := c.stream(t, "/console/api/jobs/"+job.ID+"/live", "job")
			var d struct {
				Job struct {
					Status jobs.Status `json:"status"`
				} `json:"job"`
			}
			s.next(t, &d) // the page is open, and its job watched
			require.Equal(t, jobs.StatusDead, d.Job.Status)

			require.NoError(t, tc.purge(t.Context(), b.jobs.Store, job.ID))
			select {
			case <-s.ended:
				require.Equal(t, "gone", s.last)
			case <-time.After(30 * time.Second):
				t.Fatal("the page's stream did not learn of the purge within 30s (its keep-alive is an hour away)")
			}
		})
	}
}

// TestJobLive_StalledReaderIsCutOff: the write of each event of a console stream is bounded by
// Config.EventWriteTimeout (api.event_write_timeout), as the API's streams are: a client that
// never reads a job page carrying a 2 MB result is cut off after it, not after a fixed 10 s (no
// write deadline the server set was further ahead than the configured second; the time the cut-off
// takes is the machine's, and not the check). A second, not less: the deadline also
// counts the server's own delay before the write reaches the socket (see the API's
// TestEvents_StalledReaderIsCutOff).
func TestJobLive_StalledReaderIsCutOff(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ln *httpservetest.StallListener
	c, _ := b.serveOn(t, func(cfg *console.Config) { cfg.EventWriteTimeout = time.Second },
		func(inner net.Listener) net.Listener { ln = httpservetest.NewStallListener(inner); return ln })
	job := b.jobs.Create(t, jobstestOpts())
	result, err := json.Marshal(map[string]string{"text": strings.Repeat("x", 2<<20)})
	require.NoError(t, err)
	b.jobs.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: result})
	base, err := url.Parse(b.srv.URL)
	require.NoError(t, err)
	cookies := c.http.Jar.Cookies(&url.URL{Scheme: "http", Host: base.Host, Path: console.Prefix})
	require.NotEmpty(t, cookies)

	conn := httpservetest.Dial(t, base.Host, 4<<10)
	conn.Send(t, http.MethodGet, "/console/api/jobs/"+job.ID+"/live", "Cookie: "+cookies[0].String())
	// The client reads nothing until the server has closed the connection.
	ln.WaitClosed(t, conn, "the stream still writes to a client that reads nothing")
	span := ln.WriteDeadlineSpan(conn)
	require.Positive(t, span, "the stream set no write deadline")
	require.LessOrEqual(t, span, time.Second, "a write deadline beyond the configured bound")
	resp := conn.Head(t)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	_, err = io.Copy(io.Discard, resp.Body)
	require.Error(t, err, "the stream was cut off, not ended")
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the server did not close the connection")
}

// TestLive_StreamsAreNeverStored: the event streams carry what the JSON answers do (every
// tenant's jobs, their results, the figures) to a logged-in operator only: like those answers
// they are Cache-Control: no-store. They were no-cache, which lets a cache (a proxy's, the
// browser's disk) keep a copy as long as it asks again before reusing it.
func TestLive_StreamsAreNeverStored(t *testing.T) {
	t.Parallel()
	b, c := liveBundle(t)
	job := b.jobs.Create(t, jobstestOpts())
	for _, s := range []*stream{c.stream(t, "/console/api/jobs/"+job.ID+"/live", "job"),
		c.stream(t, "/console/api/overview/live", "overview")} {
		require.Equal(t, "no-store", s.header.Get("Cache-Control"))
	}
}

// TestLive_HEADIsRefusedNotHeldOpen: a HEAD of an event stream is a 405 (Allow: GET), as the
// API's own event stream answers. It was served as the GET: the headers, then a stream without
// body that never ended, so the connection stayed taken by a handler reading the session every
// keep-alive until the client closed it, and a keep-alive client's next request on it hung.
func TestLive_HEADIsRefusedNotHeldOpen(t *testing.T) {
	t.Parallel()
	b, c := liveBundle(t)
	job := b.jobs.Create(t, jobstestOpts())
	tr := &http.Transport{MaxConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections) // before the server's Close, which waits for its handlers
	c.http.Transport = tr
	for _, path := range []string{"/console/api/jobs/" + job.ID + "/live", "/console/api/overview/live"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodHead, c.base+path, nil)
		require.NoError(t, err)
		res, err := c.http.Do(req)
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
		require.Equal(t, http.StatusMethodNotAllowed, res.StatusCode, path)
		require.Equal(t, "GET", res.Header.Get("Allow"))
		// The one connection is free for the next request.
		req, err = http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/console/api/session", nil)
		require.NoError(t, err)
		res, err = c.http.Do(req)
		require.NoError(t, err, path)
		require.NoError(t, res.Body.Close())
		require.Equal(t, http.StatusOK, res.StatusCode)
		cancel()
	}
}

// TestOverviewLive_AStreamJoiningAnOutageIsToldSo: a page that opens its stream while the
// figures cannot be recomputed gets the stale mark at once, with the time of the last figures.
func TestOverviewLive_AStreamJoiningAnOutageIsToldSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, store := b.storeBehindProxy(t)
	stopped := time.Now()
	c, _ := b.serve(t, func(cfg *console.Config) {
		cfg.Jobs, cfg.LiveInterval, cfg.Now = store, 20*time.Millisecond, func() time.Time { return stopped }
	})
	first := c.stream(t, "/console/api/overview/live", "overview", "overview_stale")
	var ov console.Overview
	first.next(t, &ov)
	proxy.Cut()
	var stale struct {
		AsOf *time.Time `json:"as_of"`
	}
	first.next(t, &stale)

	joined := c.stream(t, "/console/api/overview/live", "overview", "overview_stale")
	stale.AsOf = nil
	joined.next(t, &stale)
	require.NotNil(t, stale.AsOf, "the joining stream's first event is the stale mark")
	require.True(t, stale.AsOf.Equal(stopped))
}

// TestOverviewLive_AnOutageIsLoggedOnce: while Postgres does not answer the live overview
// recomputes every LiveInterval; it warns once when the figures go stale and says once when
// they are live again, not at every recomputation (1800 lines an hour per API host at 2 s).
func TestOverviewLive_AnOutageIsLoggedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, store := b.storeBehindProxy(t)
	var logs logtest.Buffer
	var reads atomic.Int64 // the clock's readings: two per recomputation
	c, _ := b.serve(t, func(cfg *console.Config) {
		cfg.Jobs, cfg.LiveInterval = store, 20*time.Millisecond
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		cfg.Now = func() time.Time { reads.Add(1); return time.Now() }
	})
	s := c.stream(t, "/console/api/overview/live", "overview", "overview_stale")
	var got map[string]json.RawMessage
	s.next(t, &got)

	proxy.Cut()
	s.next(t, &got) // overview_stale
	from := reads.Load()
	require.Eventually(t, func() bool { return reads.Load() >= from+2*5 }, 30*time.Second, 5*time.Millisecond,
		"five more recomputations")
	require.Equal(t, 1, strings.Count(logs.String(), "console: overview stream"), "logs:\n%s", logs.String())

	proxy.Restore()
	s.next(t, &got) // the figures again
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "console: overview live again") },
		30*time.Second, 5*time.Millisecond, "logs:\n%s", logs.String())
}
