package console_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/pgtest"
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
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	require.Equal(t, "text/event-stream", res.Header.Get("Content-Type"))
	require.Equal(t, "no-store", res.Header.Get("Cache-Control"))
	require.Equal(t, strconv.Itoa(retryAfter), res.Header.Get("Retry-After"))
	require.True(t, strings.HasPrefix(body, ": unavailable: "), body)
	require.NotContains(t, body, "event:", "nothing of the job")
	_, retryText, found := strings.Cut(body, "\nretry: ")
	require.True(t, found, body)
	retry, err := strconv.Atoi(strings.TrimSuffix(retryText, "\n\n"))
	require.NoError(t, err, body)
	require.GreaterOrEqual(t, retry, 0)
	require.Less(t, retry, retryAfter*1000)
}
