package api

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logthrottle"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

// streamAnswer is what a request for an event stream was answered, read to its end.
type streamAnswer struct {
	status              int
	contentType, body   string
	retryAfter, errType string
	err                 error
}

// getStream sends GET path with header and reads the whole answer, within 40 s: a stream that
// stays open (a served one) is an error here.
func getStream(ctx context.Context, base, path string, header map[string]string) streamAnswer {
	ctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
	if err != nil {
		return streamAnswer{err: err}
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return streamAnswer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	a := streamAnswer{status: resp.StatusCode, contentType: resp.Header.Get("Content-Type"), body: string(raw),
		retryAfter: resp.Header.Get("Retry-After"), err: err}
	if i := strings.Index(a.body, `"type":"`); i >= 0 {
		a.errType, _, _ = strings.Cut(a.body[i+len(`"type":"`):], `"`)
	}
	return a
}

// slowStreamBundle is a server whose pool goes through a proxy (every statement parsed, so that
// the test can silence one), with a signer, StoreWait and StoreTimeout 3 s (room for a new
// connection through the proxy on a loaded machine: a statement silenced must be sent, not
// refused before), a refused EventSource's retry drawn at a quarter of its ceiling, and no
// Listener (whose connection would go through the proxy too). Its store and tenants are replaced
// by ones of a pool of its own, direct (never silenced), for the test's writes.
func slowStreamBundle(t *testing.T) (*testBundle, *pgtest.Proxy) {
	t.Helper()
	signer, err := NewStreamSigner(streamKey, 10*time.Minute, time.Now)
	require.NoError(t, err)
	return proxiedStreamBundle(t, setupOpts{signer: signer, retryRand: func() float64 { return 0.25 }})
}

// proxiedStreamBundle is slowStreamBundle's server, but of opts (its signer, retry draw, tenants'
// cache TTL, keep-alive ticks) with no signer unless opts has one.
func proxiedStreamBundle(t *testing.T, opts setupOpts) (*testBundle, *pgtest.Proxy) {
	t.Helper()
	dbURL := pgtest.URL(t)
	proxy, proxied := pgtest.NewProxy(t, dbURL)
	opts.dbURL, opts.noListener = proxied+"&default_query_exec_mode=exec", true
	opts.storeWait, opts.storeTimeout = 3*time.Second, 3*time.Second
	b := setup(t, opts)
	direct, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	b.store, b.tenants = jobs.NewStore(direct, nil), tenant.NewStore(direct, nil)
	// Before the server's pool closes (setup's cleanups run after this one): a connection the
	// proxy silenced would hold that close for pgxpool's 15 s destructor timeout.
	t.Cleanup(proxy.Cut)
	return b, proxy
}

// sendTick sends the stream a keep-alive tick, failing the test unless it takes it within 30 s:
// a stream that stands still on a statement Postgres does not answer, unbounded, takes none
// before its request's context ends, which the tests set longer.
func sendTick(t *testing.T, ticks chan<- time.Time, what string) {
	t.Helper()
	select {
	case ticks <- time.Now():
	case <-time.After(30 * time.Second):
		t.Fatalf("the stream took no %s within 30 s", what)
	}
}

// answerWhileSilenced silences the next statement containing substr, sends the stream request
// and returns its answer, failing the test unless the statement was reached and the answer came
// within 30 s of it (StoreTimeout is 3 s; unbounded, the request waits for its context, 40 s,
// and ends with no answer).
func answerWhileSilenced(t *testing.T, b *testBundle, proxy *pgtest.Proxy, substr, path string, header map[string]string) streamAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	wait := proxy.SilenceStatement(substr)
	answers := make(chan streamAnswer, 1)
	go func() { answers <- getStream(ctx, b.url, path, header) }()
	require.True(t, wait(ctx), "the stream's statement %q was not sent", substr)
	select {
	case a := <-answers:
		require.NoError(t, a.err)
		// The request's own bound answered (errStoreTimeout), not the job store's bound on a
		// batch (10 s, answered "unreachable"), which the wait above also lets through.
		require.Contains(t, a.body, "the job store did not answer in time", "not the request's bound")
		return a
	case <-time.After(30 * time.Second):
		t.Fatalf("no answer within 30 s while Postgres does not answer %q", substr)
	}
	return streamAnswer{}
}

// requireReconnect requires a's answer to be the one an EventSource reconnects after: a 200
// event stream that holds nothing but a retry field of wantRetry (ms) and comments, and ends.
func requireReconnect(t *testing.T, a streamAnswer, wantRetry string) {
	t.Helper()
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, "text/event-stream", a.contentType)
	var fields []string
	for line := range strings.Lines(a.body) {
		line = strings.TrimRight(line, "\n")
		if line == "" || strings.HasPrefix(line, ":") {
			continue
		}
		fields = append(fields, line)
	}
	require.Equal(t, []string{"retry: " + wantRetry}, fields, "no event, no id (the client's Last-Event-ID is kept): %q", a.body)
}

// TestEvents_FirstReadOfTheJobIsBounded: a stream's read of its job (before any header) had no
// bound: while Postgres did not answer it, the request held its connection (one of
// api.max_connections) and a goroutine for as long. Now it is bounded as a poll's read is
// (StoreTimeout): a client that does not take event streams only is answered 503 unavailable
// with Retry-After, an EventSource (Accept: text/event-stream) an empty stream with retry: that
// it reconnects after (a 503 would end it for good).
func TestEvents_FirstReadOfTheJobIsBounded(t *testing.T) {
	t.Parallel()
	b, proxy := slowStreamBundle(t)
	job := b.create(t, "")
	path := b.srv.cfg.StreamSigner.URL(job.ID)

	a := answerWhileSilenced(t, b, proxy, "FROM jobs WHERE id = $1", path, nil)
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
	require.Equal(t, "unavailable", a.errType)
	require.Equal(t, "5", a.retryAfter)

	a = answerWhileSilenced(t, b, proxy, "FROM jobs WHERE id = $1", path, map[string]string{"Accept": "text/event-stream"})
	requireReconnect(t, a, "1250")
}

// TestEvents_WatchAndFirstReadOfEventsAreBounded: the stream's watch of its job and its first
// read of the events (jobs.Store.WatchAndRead, before any header) had no bound either.
func TestEvents_WatchAndFirstReadOfEventsAreBounded(t *testing.T) {
	t.Parallel()
	b, proxy := slowStreamBundle(t)
	job := b.create(t, "")
	path := b.srv.cfg.StreamSigner.URL(job.ID)

	a := answerWhileSilenced(t, b, proxy, "INSERT INTO job_watches", path, map[string]string{"Accept": "text/event-stream"})
	requireReconnect(t, a, "1250")
}

// TestEvents_SlowTokenLookupTellsEventSourceToReconnect: a tenant's token not cached yet, looked
// up while Postgres is slow, was answered 503 on a stream (the bound of its lookup): an
// EventSource ends for good on any answer but 200 (it waited before, and then streamed). Now an
// EventSource is answered the empty stream it reconnects after, with nothing about the job (the
// caller is not known yet); other clients still get the 503.
func TestEvents_SlowTokenLookupTellsEventSourceToReconnect(t *testing.T) {
	t.Parallel()
	b, proxy := slowStreamBundle(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, token, err := b.tenants.Create(ctx, "a", nil)
	require.NoError(t, err)
	job := b.create(t, "a")
	path := "/v1/jobs/" + job.ID + "/events"
	const lookup = "FROM tenants WHERE token_sha256 = $1"

	a := answerWhileSilenced(t, b, proxy, lookup, path, map[string]string{"Authorization": "Bearer " + token})
	require.Equal(t, http.StatusServiceUnavailable, a.status, a.body)
	require.Equal(t, "unavailable", a.errType)

	a = answerWhileSilenced(t, b, proxy, lookup, path, map[string]string{"Authorization": "Bearer " + token,
		"Accept": "text/event-stream"})
	requireReconnect(t, a, "1250")
	require.NotContains(t, a.body, job.ID)
}

// TestEvents_TokenRecheckIsBounded: a bearer stream checks its token again at its wake-ups (once
// per tenants' cache TTL), and that lookup had no bound: while Postgres did not answer it, the
// stream stood still, its keep-alives and its events with it, for as long. Now it is bounded as
// the stream's authentication is (StoreTimeout, here 3 s), and the stream goes on.
func TestEvents_TokenRecheckIsBounded(t *testing.T) {
	t.Parallel()
	ticks := make(chan time.Time)
	// A TTL of 1 ns: every wake-up of the stream checks its token again, in Postgres.
	b, proxy := proxiedStreamBundle(t, setupOpts{tenantTTL: time.Nanosecond, keepAliveTicks: ticks})
	// Longer than the waits below together: the stream's end at this context's is not taken for
	// the revocation's.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, token, err := b.tenants.Create(ctx, "a", nil)
	require.NoError(t, err)
	job := b.create(t, "a")
	s := openStreamAs(ctx, t, b.url, job.ID, token)
	require.Equal(t, "queued", s.nextEvent(t).event)

	tick := func(what string) { t.Helper(); sendTick(t, ticks, what) }
	wait := proxy.SilenceStatement("FROM tenants WHERE token_sha256 = $1")
	tick("keep-alive")
	require.True(t, wait(ctx), "the stream did not check its token again")
	// The check is silenced: bounded, it fails within StoreTimeout and the stream goes on.
	tick("keep-alive after its token's check")
	f, ok := s.next(t)
	require.True(t, ok)
	require.Equal(t, "keep-alive", f.comment)

	// Postgres answering again (the silenced connections dropped), the checks go on: a
	// revocation ends the stream at its first wake-up whose check Postgres answers.
	proxy.Reset()
	_, err = b.tenants.Revoke(ctx, "a")
	require.NoError(t, err)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			if _, ok, err := readFrame(s.lines); !ok || err != nil {
				return
			}
		}
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case ticks <- time.Now():
		case <-ended:
			return
		case <-deadline:
			t.Fatal("the stream of a revoked token goes on")
		}
	}
}

// TestEvents_RefusedEventSourceRetryIsJittered: an EventSource refused for a passing reason was
// told to come back after exactly the Retry-After (5000 ms): every page refused in the same
// slowdown came back in the same millisecond. The retry is a full-jitter draw below it now. And
// only a client that takes event streams is told so: not one whose Accept refuses them (q=0) or
// names only wildcards (curl's */*); a refusal that will not heal (401, 404) stays final.
func TestEvents_RefusedEventSourceRetryIsJittered(t *testing.T) {
	t.Parallel()
	s := &Server{cfg: Config{Logger: slog.New(slog.DiscardHandler), retryRand: func() float64 { return 0.5 }},
		streamLog: logthrottle.New(&logthrottle.Config{Every: streamLogInterval})}
	// A request whose store bound passed: its context canceled with errStoreTimeout (storeBounded).
	timedOut, cancel := context.WithCancelCause(context.Background())
	cancel(errStoreTimeout)
	answer := func(accept string, err error) *httptest.ResponseRecorder {
		r := httptest.NewRequestWithContext(timedOut, http.MethodGet, "/v1/jobs/x/events", nil)
		if accept != "" {
			r.Header.Set("Accept", accept)
		}
		w := httptest.NewRecorder()
		s.refuseStream(w, r, err)
		return w
	}
	for _, accept := range []string{"text/event-stream", "text/event-stream; charset=utf-8",
		"text/html, Text/Event-Stream;q=0.5", "application/json;q=0.9,text/event-stream"} {
		w := answer(accept, context.Canceled)
		require.Equal(t, http.StatusOK, w.Code, accept)
		require.Contains(t, w.Body.String(), "\nretry: 2500\n\n", accept)
	}
	for _, accept := range []string{"", "*/*", "text/*", "text/event-stream;q=0", "text/event-stream; q=0.0, */*"} {
		w := answer(accept, context.Canceled)
		require.Equal(t, http.StatusServiceUnavailable, w.Code, accept)
		require.Equal(t, "5", w.Header().Get("Retry-After"), accept)
	}
	w := answer("text/event-stream", unauthorized("invalid_token", "unknown bearer token: no tenant has it"))
	require.Equal(t, http.StatusUnauthorized, w.Code)
}

// eventSourceJS opens EVENTS_URL with the npm eventsource package and prints "open" at each
// connection, the first status event's name, or "failed" and the answer's status when the
// EventSource ends for good.
const eventSourceJS = `
import { EventSource } from 'eventsource'
const es = new EventSource(process.env.EVENTS_URL)
es.addEventListener('open', () => console.log('open'))
es.addEventListener('queued', () => { console.log('queued'); es.close(); process.exit(0) })
es.addEventListener('error', (e) => {
  if (es.readyState === EventSource.CLOSED) { console.log('failed ' + e.code); process.exit(0) }
})
`

// TestEvents_EventSourceReconnectsAfterSlowFirstRead: a browser's stream (a signed events_url,
// followed by the npm eventsource package, which does as the SSE spec says) whose first read of
// its job passes its bound (Postgres does not answer) is told to come back, and gets its events
// when it does: a 503 there ended the EventSource for good.
func TestEvents_EventSourceReconnectsAfterSlowFirstRead(t *testing.T) {
	t.Parallel()
	install := exec.Command(filepath.Join("..", "..", "scripts", "js.sh"))
	out, err := install.CombinedOutput()
	require.NoError(t, err, "scripts/js.sh: %s", out)
	b, proxy := slowStreamBundle(t)
	job := b.create(t, "")

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wait := proxy.SilenceStatement("FROM jobs WHERE id = $1")
	cmd := exec.CommandContext(ctx, "node", "--input-type=module", "--eval", eventSourceJS)
	cmd.Dir, cmd.Env = filepath.Join("..", "..", "test", "js"), append(os.Environ(), "EVENTS_URL="+b.url+b.srv.cfg.StreamSigner.URL(job.ID))
	cmd.WaitDelay = 5 * time.Second
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Wait() }()
	defer cancel() // kills node if the test ends first
	require.True(t, wait(ctx), "the stream did not read its job")

	var lines []string
	scanner := bufio.NewScanner(stdout)
	for scanner.Scan() {
		lines = append(lines, scanner.Text())
		if l := scanner.Text(); l == "queued" || strings.HasPrefix(l, "failed") {
			break
		}
	}
	require.NotEmpty(t, lines, "the EventSource printed nothing")
	require.Equal(t, "queued", lines[len(lines)-1], "the EventSource's lines: %q", lines)
	require.Equal(t, []string{"open", "open", "queued"}, lines, "told to come back (an empty stream), then served")
}
