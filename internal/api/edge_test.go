package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/httpserve/httpservetest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
)

func (b *testBundle) openStreams(tenant string) int {
	b.srv.streams.mu.Lock()
	defer b.srv.streams.mu.Unlock()
	return b.srv.streams.count[tenant]
}

// TestEvents_StalledReaderIsCutOff: a client that never reads a 2 MB result stalls the stream's
// write; the event's write deadline ends the handler, which frees the event and its place.
//
// The deadline runs from the write's start, so it also counts the server's own delay before the
// write reaches the socket: on loaded cores under the race detector, 200 ms was sometimes gone
// before the answer's first byte was sent, and the client saw the connection end with no head.
// A second keeps that delay out of the test without making it slow.
func TestEvents_StalledReaderIsCutOff(t *testing.T) {
	t.Parallel()
	var ln *httpservetest.StallListener
	b := setup(t, setupOpts{eventWriteTimeout: time.Second,
		listener: func(inner net.Listener) net.Listener { ln = httpservetest.NewStallListener(inner); return ln }})
	job := b.create(t, "")
	result, err := json.Marshal(map[string]string{"text": strings.Repeat("x", 2<<20)})
	require.NoError(t, err)
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: result})

	c := httpservetest.Dial(t, strings.TrimPrefix(b.url, "http://"), 4<<10)
	c.Send(t, http.MethodGet, "/v1/jobs/"+job.ID+"/events")
	// The client reads nothing until the server has closed the connection: then what it had not
	// read (the answer's head, part of the event) is still in its socket, and the connection's end.
	ln.WaitClosed(t, c, "the stream still writes to a client that reads nothing")
	// Cut off by the configured bound, not the default's 10 s, which WaitClosed's 30 s would let
	// pass: the span of the write deadlines the server set tells, whatever the machine's speed.
	span := ln.WriteDeadlineSpan(c)
	require.Positive(t, span, "the stream set no write deadline")
	require.LessOrEqual(t, span, time.Second, "a write deadline beyond the configured bound")
	resp := c.Head(t)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	_, err = io.Copy(io.Discard, resp.Body)
	require.Error(t, err, "the stream was cut off, not ended")
	require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the server did not close the connection")
	require.Eventually(t, func() bool { return b.openStreams("default") == 0 && b.listener.Subscribers() == 0 },
		httpservetest.Wait, 5*time.Millisecond, "the stream's slot and subscription were not released")
}

// TestEvents_StreamOutlivesReadTimeout: the server's read timeout bounds reading a request, not
// the life of an event stream that follows it.
func TestEvents_StreamOutlivesReadTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{keepAlive: 20 * time.Millisecond,
		server: &httpserve.Config{ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond}})
	job := b.create(t, "")
	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, "queued", s.nextEvent(t).event)
	start := time.Now()
	for time.Since(start) < 300*time.Millisecond { // three read and write timeouts
		f, ok := s.next(t)
		require.True(t, ok, "the stream ended after %s", time.Since(start))
		require.Equal(t, "keep-alive", f.comment)
	}
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
	require.Equal(t, []string{"running/2", "succeeded/3"}, names(s.rest(t)))
}

func TestEvents_StreamsPerTenantCap(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxStreams: 2})
	acme := b.newTenant(t, "acme")
	job := b.create(t, "")

	first := openStream(t, b.url, job.ID, "")
	openStream(t, b.url, job.ID, "").nextEvent(t)
	first.nextEvent(t)
	r := b.do(t, http.MethodGet, "/v1/jobs/"+job.ID+"/events", "", nil)
	requireError(t, r, http.StatusTooManyRequests, "too_many_streams")
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err)
	require.Positive(t, secs)

	// Another tenant has its own places.
	other := b.create(t, "acme")
	require.Equal(t, http.StatusOK, streamStatus(t, b.url, other.ID, acme))
	// A place frees when a stream ends.
	first.close()
	require.Eventually(t, func() bool { return b.openStreams("default") == 1 }, httpservetest.Wait, 5*time.Millisecond)
	openStream(t, b.url, job.ID, "").nextEvent(t)
}

// streamStatus opens the job's event stream with header h and closes it at once.
func streamStatus(t *testing.T, base, id string, h map[string]string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), httpservetest.Wait)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/jobs/"+id+"/events", nil)
	require.NoError(t, err)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp.StatusCode
}

func TestServer_TrickledBodyIsCutOff(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{server: &httpserve.Config{ReadTimeout: 200 * time.Millisecond}})
	addr := strings.TrimPrefix(b.url, "http://")

	t.Run("Submit", func(t *testing.T) {
		t.Parallel()
		c := httpservetest.Dial(t, addr, 0)
		c.Send(t, http.MethodPost, "/v1/jobs", "Content-Length: 1000")
		defer c.Trickle(20*time.Millisecond, 1000)()
		resp := c.Response(t)
		require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
		c.RequireClosed(t)
	})
	t.Run("HealthzWithoutAuth", func(t *testing.T) {
		t.Parallel()
		c := httpservetest.Dial(t, addr, 0)
		c.Send(t, http.MethodPost, "/healthz", "Content-Length: 1000")
		defer c.Trickle(20*time.Millisecond, 1000)()
		require.Equal(t, http.StatusMethodNotAllowed, c.Response(t).StatusCode)
		c.RequireClosed(t)
	})
	require.Zero(t, countJobs(t, b, "default"))
}

// TestServer_HeadAnswersAsGet: HEAD answers as GET does, without a body, wherever GET is served
// (RFC 9110 §9.3.2; load balancers' health checks send HEAD), except on the event stream, which
// never ends.
func TestServer_HeadAnswersAsGet(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	job := b.create(t, "")
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/v1/jobs/" + job.ID,
		"/v1/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc"} {
		get := b.do(t, http.MethodGet, path, "", nil)
		head := b.do(t, http.MethodHead, path, "", nil)
		require.Equal(t, get.status, head.status, "HEAD %s", path)
		require.Equal(t, get.header.Get("Content-Type"), head.header.Get("Content-Type"), "HEAD %s", path)
		require.Nil(t, head.body, "HEAD %s", path)
	}

	events := b.do(t, http.MethodHead, "/v1/jobs/"+job.ID+"/events", "", nil)
	require.Equal(t, http.StatusMethodNotAllowed, events.status)
	require.Equal(t, "GET, OPTIONS", events.header.Get("Allow")) // OPTIONS: the CORS preflight
	require.Equal(t, "DELETE, GET, HEAD", b.do(t, http.MethodPut, "/v1/jobs/"+job.ID, "", nil).header.Get("Allow"))
}

// TestServer_NonCanonicalPathsAre404: a path with an empty segment or a dot segment is an unknown
// path, answered 404 not_found as api/openapi.yaml promises, not a redirect to its cleaned form:
// the redirect's Location drops a proxy's path prefix, re-sends a submit elsewhere, and is no
// answer the contract describes (undocumented 307, text/html).
func TestServer_NonCanonicalPathsAre404(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	job := b.create(t, "")
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, rt := range []struct{ method, path string }{
		{http.MethodPost, "//v1/jobs"}, {http.MethodPost, "/v1//jobs"}, {http.MethodPost, "/v1/./jobs"},
		{http.MethodGet, "//v1/jobs/" + job.ID}, {http.MethodDelete, "/v1/jobs/" + job.ID + "/../" + job.ID},
		{http.MethodGet, "/v1/jobs/" + job.ID + "/events/.."}, {http.MethodHead, "/healthz/."}, {http.MethodGet, "//metrics"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), httpservetest.Wait)
		req, err := http.NewRequestWithContext(ctx, rt.method, b.url+rt.path, strings.NewReader(minimalSubmit))
		require.NoError(t, err)
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		cancel()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, "%s %s: %s", rt.method, rt.path, raw)
		require.Empty(t, resp.Header.Get("Location"), "%s %s", rt.method, rt.path)
		if rt.method != http.MethodHead {
			require.Contains(t, string(raw), `"type":"not_found"`, "%s %s", rt.method, rt.path)
		}
	}
	got, err := b.store.Get(context.Background(), job.ID)
	require.NoError(t, err)
	require.Equal(t, "queued", string(got.Status), "no path with dot segments canceled the job")
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM jobs").Scan(&n))
	require.Equal(t, 1, n, "no submit to a path with an empty or dot segment stored a job")
}

func TestAuth_RevokedTokenLogIsThrottled(t *testing.T) {
	t.Parallel()
	var logs logtest.Buffer
	clock := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	b := setup(t, setupOpts{noAnonymous: true, now: clock.Now,
		logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	revoked := b.newTenant(t, "gone")
	_, err := b.tenants.Revoke(context.Background(), "gone")
	require.NoError(t, err)

	for range 5 {
		requireError(t, b.do(t, http.MethodPost, "/v1/jobs", minimalSubmit, revoked), http.StatusForbidden, "token_revoked")
	}
	clock.Advance(authLogInterval)
	requireError(t, b.do(t, http.MethodGet, "/v1/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc", "", revoked), http.StatusForbidden, "token_revoked")

	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		lines = append(lines, m)
	}
	require.Len(t, lines, 2, "one line per tenant and minute: %s", logs.String())
	require.EqualValues(t, 0, lines[0]["suppressed"])
	require.EqualValues(t, 4, lines[1]["suppressed"], "the next line counts those left out")
	require.Equal(t, "gone", lines[1]["tenant"])
}

// TestEvents_WriteDeadlineIsRenewed: the write deadline bounds a write, not the stream's life: a
// stream idle for longer than the event write timeout still sends the next event. The timeout
// leaves room for the server's own delay on loaded cores (see TestEvents_StalledReaderIsCutOff).
func TestEvents_WriteDeadlineIsRenewed(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	b := setup(t, setupOpts{eventWriteTimeout: timeout})
	job := b.create(t, "")
	s := openStream(t, b.url, job.ID, "")
	defer s.close()
	require.Equal(t, "queued", s.nextEvent(t).event)
	time.Sleep(3 * timeout) // idle past the deadline of the first event's write
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)})
	require.Equal(t, "running", s.nextEvent(t).event)
	require.Equal(t, "succeeded", s.nextEvent(t).event)
}

// TestSubmit_EnqueueOutlivesTheClient: a client that leaves once its job is committed (a timeout,
// a closed connection) does not leave the job without its task, waiting for the sweeper: the
// enqueue after the commit does not take the request's cancellation.
func TestSubmit_EnqueueOutlivesTheClient(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	calls := 0
	b := setup(t, setupOpts{now: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 2 { // the submit's second reading of the clock, just after the commit
			cancel()
		}
		return time.Now()
	}})
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit))
	rec := httptest.NewRecorder()
	b.srv.ServeHTTP(rec, req)
	require.Error(t, ctx.Err(), "the client left during the submit")
	var got struct{ ID string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got), rec.Body.String())
	_, err := b.store.Get(context.Background(), got.ID)
	require.NoError(t, err, "the job is committed")
	_, err = b.inspector.GetTaskInfo(b.queue, got.ID)
	require.NoError(t, err, "and has its task")
}

// TestSubmit_BodiesInFlightAreBounded: the submit bodies a replica reads at once are bounded
// (Config.MaxBodyBytesInFlight), each counted at its Content-Length or, without one, at the
// largest body allowed: many clients sending large bodies slowly cannot make it hold more. A
// submit over the budget is a 503 naming the overload, with Retry-After; the budget comes back
// when a body's request ends. A Content-Length above the largest body is a 413 before any read.
func TestSubmit_BodiesInFlightAreBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxBody: 1000, maxBodyInFlight: 1500})
	addr := strings.TrimPrefix(b.url, "http://")
	body := `{"request":{"model":"m"}}`

	// 1000 bytes announced, 10 sent: the body holds 1000 of the 1500 while it is read.
	slow := httpservetest.Dial(t, addr, 0)
	slow.Send(t, http.MethodPost, "/v1/jobs", "Content-Length: 1000", "Content-Type: application/json")
	_, err := io.WriteString(slow, `{"request"`)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.srv.bodies.inFlight() == 1000 }, httpservetest.Wait, time.Millisecond)

	// From another tenant (the slow body holds the anonymous tenant's share, see
	// TestSubmit_OneTenantHoldsAtMostHalfTheBodyBudget), 600 more would pass the budget; a body
	// without a length counts 1000.
	_, token, err := b.tenants.Create(context.Background(), "acme", nil)
	require.NoError(t, err)
	acme := map[string]string{"Authorization": "Bearer " + token}
	over := do(t, b.url, http.MethodPost, "/v1/jobs", body+strings.Repeat(" ", 600-len(body)), acme)
	require.Equal(t, http.StatusServiceUnavailable, over.status, "body %v", over.body)
	require.Equal(t, "overloaded", over.body["error"].(map[string]any)["type"])
	require.Equal(t, "1", over.header.Get("Retry-After"))
	chunked := httpservetest.Dial(t, addr, 0)
	chunked.Send(t, http.MethodPost, "/v1/jobs", "Authorization: Bearer "+token, "Transfer-Encoding: chunked",
		"Content-Type: application/json")
	_, err = fmt.Fprintf(chunked, "%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, chunked.Response(t).StatusCode)
	// What fits is read.
	require.Equal(t, http.StatusAccepted, do(t, b.url, http.MethodPost, "/v1/jobs", body, acme).status)
	// Too large for any budget: refused before its body is asked for (no 100 Continue).
	huge := httpservetest.Dial(t, addr, 0)
	huge.Send(t, http.MethodPost, "/v1/jobs", "Content-Length: 1001", "Content-Type: application/json",
		"Expect: 100-continue")
	require.Equal(t, http.StatusRequestEntityTooLarge, huge.Response(t).StatusCode)

	// The slow body ends (a 400: it is not JSON); its bytes come back to the budget.
	_, err = io.WriteString(slow, strings.Repeat(" ", 990))
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, slow.Response(t).StatusCode)
	require.Eventually(t, func() bool { return b.srv.bodies.inFlight() == 0 }, httpservetest.Wait, time.Millisecond)
	require.Equal(t, http.StatusAccepted, do(t, b.url, http.MethodPost, "/v1/jobs", body+strings.Repeat(" ", 600-len(body)), nil).status)
}

// TestSubmit_OneTenantHoldsAtMostHalfTheBodyBudget: one tenant's submit bodies hold at most half
// of the replica's budget of bodies in flight, so that one tenant (or the anonymous clients, one
// tenant) announcing large bodies and sending them slowly cannot make every other tenant's small
// submit a 503 until they end.
func TestSubmit_OneTenantHoldsAtMostHalfTheBodyBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{maxBody: 1000, maxBodyInFlight: 2500})
	addr := strings.TrimPrefix(b.url, "http://")
	_, token, err := b.tenants.Create(context.Background(), "acme", nil)
	require.NoError(t, err)
	// slow announces a body of 1000 bytes for acme and waits for the server's first answer: 100
	// Continue once the body is being read (its bytes reserved), or the final refusal.
	slow := func() (*httpservetest.Conn, int) {
		c := httpservetest.Dial(t, addr, 0)
		c.Send(t, http.MethodPost, "/v1/jobs", "Authorization: Bearer "+token, "Content-Length: 1000",
			"Content-Type: application/json", "Expect: 100-continue")
		return c, c.Response(t).StatusCode
	}
	first, status := slow()
	require.Equal(t, http.StatusContinue, status)
	require.Equal(t, int64(1000), b.srv.bodies.inFlight())
	// A second would make acme hold 2000 of the 2500.
	_, status = slow()
	require.Equal(t, http.StatusTooManyRequests, status, "one tenant holds more than half the budget")
	require.Equal(t, int64(1000), b.srv.bodies.inFlight())

	// Another tenant (here the anonymous one) still has the rest.
	body := `{"request":{"model":"m"}}`
	got := do(t, b.url, http.MethodPost, "/v1/jobs", body+strings.Repeat(" ", 1000-len(body)), nil)
	require.Equal(t, http.StatusAccepted, got.status, "body %v", got.body)

	// acme's body ends; its share comes back.
	_, err = io.WriteString(first, strings.Repeat(" ", 1000))
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, first.Response(t).StatusCode)
	require.Eventually(t, func() bool { return b.srv.bodies.inFlight() == 0 }, httpservetest.Wait, time.Millisecond)
	_, status = slow()
	require.Equal(t, http.StatusContinue, status)
}
