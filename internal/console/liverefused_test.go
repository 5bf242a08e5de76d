package console_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/secrettoken"
)

// TestLive_RefusedEventSourceIsToldToComeBack: a live page's stream refused for a passing reason
// before its first event (the database unreachable, or past its bound) was answered 503, which
// ends a browser's EventSource for good: the page then waited its fixed reopen delay (every page
// the outage refused together) and read its job or session once more before it opened the stream
// again. An EventSource (Accept: text/event-stream) is now answered as the API's streams answer
// it: a 200 event stream holding the error as a comment and a retry field, a full-jitter draw
// below the Retry-After (5 s), and the end, after which the browser reconnects by itself. Other
// clients keep the 503; a refusal that will not heal (a job not found) stays final.
func TestLive_RefusedEventSourceIsToldToComeBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, store := b.storeBehindProxy(t)
	c, _ := b.serve(t, func(cfg *console.Config) { cfg.Jobs = store })
	job := b.jobs.Create(t, jobstestOpts())
	proxy.Cut()
	get := func(path, accept string) (*http.Response, string) { return getLive(t, c, path, accept) }
	path := "/console/api/jobs/" + job.ID + "/live"
	res, body := get(path, "text/event-stream")
	requireToldToComeBack(t, res, body, 5)

	res, body = get(path, "")
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, body)

	proxy.Restore()
	res, body = get("/console/api/jobs/00000000-0000-4000-8000-000000000000/live", "text/event-stream")
	require.Equal(t, http.StatusNotFound, res.StatusCode, body)
}

// TestLive_RefusedSessionLookupTellsEventSourceToComeBack: a live page's stream (the overview's
// or a job's) whose session lookup fails for a reason that passes (the database unreachable) is
// refused as a read of the stream's own is: an EventSource is told to come back, another client
// gets the 503; the overview's stream has no read of its own before its first event, so its
// session lookup is the one refusal it meets. An unknown session stays final (401).
func TestLive_RefusedSessionLookupTellsEventSourceToComeBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, proxied := pgtest.NewProxy(t, b.jobs.URL)
	pool, err := pgxpool.New(context.Background(), proxied)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Cut) // before the pool's close, which waits for its connections
	c, _ := b.serve(t, func(cfg *console.Config) { cfg.Pool = pool })
	job := b.jobs.Create(t, jobstestOpts())
	proxy.Cut()
	for _, path := range []string{"/console/api/overview/live", "/console/api/jobs/" + job.ID + "/live"} {
		res, body := getLive(t, c, path, "text/event-stream")
		requireToldToComeBack(t, res, body, 5)
		res, body = getLive(t, c, path, "*/*")
		require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, body)
		require.Contains(t, body, `"unavailable"`)
	}
	proxy.Restore()
	stranger := b.anonymous(t)
	u, err := url.Parse(c.base)
	require.NoError(t, err)
	stranger.http.Jar.SetCookies(u, []*http.Cookie{{Name: "llmq_console", Value: "not-a-session"}})
	res, body := getLive(t, stranger, "/console/api/overview/live", "text/event-stream")
	require.Equal(t, http.StatusUnauthorized, res.StatusCode, body)
}

// TestLive_FullSessionLookupsTellEventSourceToComeBack: a live page's stream whose session
// cookie this process has not found live yet (an operator's page reconnecting to a replica that
// just started, or one behind a load balancer that moved it) waits for a place among the
// console's credential lookups; when they stay full past LookupWait (a flood of made-up cookies
// while Postgres is slow) the refusal passes, as the database's does: an EventSource is told to
// come back, within the refusal's Retry-After (1 s), and another client gets the 503 overloaded.
func TestLive_FullSessionLookupsTellEventSourceToComeBack(t *testing.T) {
	t.Parallel()
	b, _ := setupFourConns(t, 200*time.Millisecond) // one lookup at a time
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job := b.jobs.Create(t, jobstestOpts())

	// A made-up cookie's lookup holds the one place, waiting in Postgres behind a lock of the
	// sessions table.
	conn, err := pgx.Connect(ctx, b.jobs.URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait() // after the rollback, which ends the lookup waiting
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	rollback := sync.OnceFunc(func() { require.NoError(t, tx.Rollback(ctx)) })
	defer rollback()
	_, err = tx.Exec(ctx, `LOCK TABLE operator_sessions IN ACCESS EXCLUSIVE MODE`)
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, b.jobs.URL)
	require.NoError(t, err)
	defer watch.Close(context.Background())
	answers := make(chan cookieAnswer, 1)
	holder, err := secrettoken.New(nil, "")
	require.NoError(t, err)
	wg.Go(func() { answers <- sessionWith(ctx, b.srv.URL, holder) })
	require.Empty(t, pgtest.LockWaitingOrAnswered(ctx, t, watch, answers, 1, "the place's lookup"))

	page := b.anonymous(t)
	u, err := url.Parse(b.srv.URL)
	require.NoError(t, err)
	cookie, err := secrettoken.New(nil, "")
	require.NoError(t, err)
	page.http.Jar.SetCookies(u, []*http.Cookie{{Name: "llmq_console", Value: cookie}})
	for _, path := range []string{"/console/api/overview/live", "/console/api/jobs/" + job.ID + "/live"} {
		res, body := getLive(t, page, path, "text/event-stream")
		requireToldToComeBackAs(t, res, body, "overloaded", 1)
		res, body = getLive(t, page, path, "*/*")
		require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, body)
		require.Contains(t, body, `"overloaded"`)
		require.Equal(t, "1", res.Header.Get("Retry-After"))
	}
	rollback()
	select {
	case a := <-answers:
		require.Equal(t, http.StatusUnauthorized, a.status, a.body)
	case <-ctx.Done():
		t.Fatal("the place's lookup did not end")
	}
}

// getLive GETs path with Accept accept (none when empty) and reads the answer to its end.
func getLive(t *testing.T, c *client, path, accept string) (*http.Response, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	require.NoError(t, err)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	res, err := c.http.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err, "the refusal's stream ends")
	return res, string(body)
}

// requireToldToComeBack asserts that res is a refused EventSource's answer: a 200 event stream
// holding the refusal as a comment and a retry field below Retry-After (retryAfter seconds),
// nothing of a job.
func requireToldToComeBack(t *testing.T, res *http.Response, body string, retryAfter int) {
	t.Helper()
	requireToldToComeBackAs(t, res, body, "unavailable", retryAfter)
}

// requireToldToComeBackAs is requireToldToComeBack for a refusal of type typ.
func requireToldToComeBackAs(t *testing.T, res *http.Response, body, typ string, retryAfter int) {
	t.Helper()
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	require.Equal(t, strconv.Itoa(retryAfter), res.Header.Get("Retry-After"))
	require.True(t, strings.HasPrefix(body, ": "+typ+": "), body)
	require.NotContains(t, body, "event:", "nothing of the job")
	_, retryText, found := strings.Cut(body, "\nretry: ")
	require.True(t, found, body)
	retry, err := strconv.Atoi(strings.TrimSuffix(retryText, "\n\n"))
	require.NoError(t, err, body)
	require.GreaterOrEqual(t, retry, 0)
	require.Less(t, retry, retryAfter*1000)
}
