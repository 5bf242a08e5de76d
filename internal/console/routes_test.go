package console_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/jobstest"
)

// consoleOperations returns the console's operations api/openapi.yaml documents: "METHOD path".
func consoleOperations(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../../api/openapi.yaml")
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	var ops []string
	for path, item := range doc.Paths {
		if !strings.HasPrefix(path, console.Prefix) {
			continue
		}
		for method := range item {
			switch method {
			case "get", "head", "post", "put", "patch", "delete", "options", "trace":
				ops = append(ops, strings.ToUpper(method)+" "+path)
			}
		}
	}
	slices.Sort(ops)
	return ops
}

// TestRoutes_MatchOpenAPI: every operation the console serves is documented in api/openapi.yaml,
// and every documented one is served (its answer, without a session, is the operation's: not the
// catch-all's 404 nor a 405). The answers themselves are checked against their schemas by every
// test's server (setup: openapitest.Handler).
func TestRoutes_MatchOpenAPI(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h, err := console.New(console.Config{Pool: b.jobs.Pool, Jobs: b.jobs.Store, Redis: b.rdb, RedisPrefix: b.prefix})
	require.NoError(t, err)
	var served []string
	for _, op := range console.Routes(h) {
		// As the description writes them: the page's exact path, the static files' one segment.
		op = strings.TrimSuffix(op, "{$}")
		if strings.HasSuffix(op, "/static/") {
			op += "{file}"
		}
		served = append(served, op)
	}
	slices.Sort(served)
	documented := consoleOperations(t)
	require.Equal(t, served, documented)

	c := b.anonymous(t)
	for _, op := range documented {
		method, path, _ := strings.Cut(op, " ")
		path = strings.NewReplacer("{id}", "0190a5b2-7c1e-7d3f-9a8b-123456789abc", "{name}", "acme", "{file}", "app.js").Replace(path)
		res, body := c.do(method, path, nil, nil)
		require.NotEqual(t, http.StatusMethodNotAllowed, res.StatusCode, "%s: %s", op, body)
		require.NotContains(t, body, "no console route", op)
	}
}

// TestRoutes_MethodNotAllowed: a method a console path does not serve is 405 method_not_allowed
// with Allow, as api/openapi.yaml promises of every path (the API's answer). It was the
// catch-all's 404 not_found, as for a path the console does not have.
func TestRoutes_MethodNotAllowed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodGet, "/console/api/login", "POST"},
		{http.MethodDelete, "/console/api/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc", "GET, HEAD"},
		{http.MethodGet, "/console/api/jobs/0190a5b2-7c1e-7d3f-9a8b-123456789abc/cancel", "POST"},
		{http.MethodPut, "/console/api/tenants", "GET, HEAD, POST"},
		{http.MethodPost, "/console/api/overview/live", "GET"},
		{http.MethodPost, "/console/", "GET, HEAD"},
	} {
		res, body := c.do(tc.method, tc.path, nil, nil)
		requireError(t, res, body, http.StatusMethodNotAllowed, "method_not_allowed")
		require.Equal(t, tc.allow, res.Header.Get("Allow"), "%s %s", tc.method, tc.path)
	}
	// A path the console does not have is still 404.
	res, body := c.do(http.MethodGet, "/console/api/nope", nil, nil)
	requireError(t, res, body, http.StatusNotFound, "not_found")
}

// TestStatic_OnlyThePageFiles: under /console/static/ the console serves its page's scripts and
// style sheets and nothing else, each a 404 not_found: the directory, which the file server
// answered with index.html (200, the page), index.html, which it redirected there (301), a path
// through a file or a directory, a missing file (the file server's plain-text 404).
func TestStatic_OnlyThePageFiles(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.anonymous(t)
	c.http.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for _, path := range []string{"/console/static/", "/console/static/index.html", "/console/static/app.js/",
		"/console/static/x/", "/console/static/x/app.js", "/console/static/nope.js"} {
		res, body := c.do(http.MethodGet, path, nil, nil)
		requireError(t, res, body, http.StatusNotFound, "not_found")
		require.NotContains(t, body, "href=", path) // neither a listing nor the page
		res, _ = c.do(http.MethodHead, path, nil, nil)
		require.Equal(t, http.StatusNotFound, res.StatusCode, "HEAD %s", path)
	}
	for _, file := range []string{"app.js", "app.css"} {
		res, body := c.do(http.MethodGet, "/console/static/"+file, nil, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, file)
		require.NotEmpty(t, body, file)
	}
}

// TestJobRoutes_AnIDNotAUUIDIsNamed: a job route's {id} that is not a UUID is 404 not_found
// saying so, before any read (the job page, its stream, a cancel), not "no job with that id (it
// may have been purged)" as if there had been one. A UUID in capitals is a job ID. The check
// comes after the session's: without one the answer is 401, without the CSRF token 403, whatever
// the ID.
func TestJobRoutes_AnIDNotAUUIDIsNamed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c, anon := b.login(t), b.anonymous(t)
	for _, op := range []struct{ method, path string }{{http.MethodGet, ""}, {http.MethodGet, "/live"}, {http.MethodPost, "/cancel"}} {
		res, body := anon.do(op.method, "/console/api/jobs/nope"+op.path, nil, nil)
		requireError(t, res, body, http.StatusUnauthorized, "unauthorized")
	}
	res, body := c.do(http.MethodPost, "/console/api/jobs/nope/cancel", nil, http.Header{"X-CSRF-Token": {"wrong"}})
	require.Equal(t, http.StatusForbidden, res.StatusCode, body)
	for _, id := range []string{"nope", "0190a5b2-7c1e-7d3f-9a8b-123456789abcd", "0190a5b2x7c1e-7d3f-9a8b-123456789abc",
		"%00", "caf%C3%A9", strings.Repeat("a", 4000)} {
		for _, op := range []struct{ method, path string }{{http.MethodGet, ""}, {http.MethodGet, "/live"}, {http.MethodPost, "/cancel"}} {
			res, body := c.do(op.method, "/console/api/jobs/"+id+op.path, nil, nil)
			requireError(t, res, body, http.StatusNotFound, "not_found")
			require.Contains(t, body, "is not a job ID: a job ID is a UUID", "%s %s", op.method, op.path)
			require.Less(t, len(body), 400, "the message quotes a long ID cut short")
		}
	}
	job := b.jobs.Create(t, jobstest.Opts{})
	res, body = c.do(http.MethodGet, "/console/api/jobs/"+strings.ToUpper(job.ID), nil, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
}

// TestJobLive_AnIDNotAUUIDTakesNoStreamPlace: a job's live page whose {id} is not a job ID is
// refused before it takes one of the process's event stream places (Config.OpenStream): with
// none free it answered 503 overloaded, and with one free it held it for the store's read.
func TestJobLive_AnIDNotAUUIDTakesNoStreamPlace(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32
	b := setupConfig(t, func(cfg *console.Config) {
		cfg.OpenStream = func() (func(), time.Duration, bool) { asked.Add(1); return nil, time.Second, false }
	})
	c := b.login(t)
	res, body := c.do(http.MethodGet, "/console/api/jobs/nope/live", nil, nil)
	requireError(t, res, body, http.StatusNotFound, "not_found")
	require.Zero(t, asked.Load(), "a stream place was asked for")
}

// TestPageFiles_ETagAnswers304: the page and its files carry a strong ETag, a hash of their
// content (so that every replica of a release gives the same, and a release that changes a file
// another), and Cache-Control no-cache (a browser asks again on each load: a new release is never
// served from its cache); a request whose If-None-Match names the ETag is answered 304 without a
// body, GET or HEAD, and one naming another the file. They had no ETag (nor a modification time:
// the files are embedded), and only If-None-Match: * was answered 304: a browser downloaded them
// in full on every load.
func TestPageFiles_ETagAnswers304(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.anonymous(t)
	etags := map[string]bool{}
	for _, path := range []string{"/console/", "/console/static/app.js", "/console/static/app.css"} {
		res, body := c.do(http.MethodGet, path, nil, nil)
		require.Equal(t, http.StatusOK, res.StatusCode, path)
		etag := res.Header.Get("ETag")
		sum := sha256.Sum256([]byte(body))
		require.Equal(t, `"`+hex.EncodeToString(sum[:16])+`"`, etag, "%s: a strong ETag of the content", path)
		require.Equal(t, "no-cache", res.Header.Get("Cache-Control"), path)
		etags[etag] = true

		for _, method := range []string{http.MethodGet, http.MethodHead} {
			for _, inm := range []string{etag, `"other", ` + etag} {
				res, body := c.do(method, path, nil, http.Header{"If-None-Match": {inm}})
				require.Equal(t, http.StatusNotModified, res.StatusCode, "%s %s If-None-Match: %s", method, path, inm)
				require.Empty(t, body)
				require.Equal(t, etag, res.Header.Get("ETag"), path)
				require.Equal(t, "no-cache", res.Header.Get("Cache-Control"), path)
			}
			res, _ := c.do(method, path, nil, http.Header{"If-None-Match": {`"` + strings.Repeat("0", 32) + `"`}})
			require.Equal(t, http.StatusOK, res.StatusCode, "%s %s: a copy of another release", method, path)
		}
		res, got := c.do(http.MethodGet, path, nil, http.Header{"If-None-Match": {"W/" + etag}})
		require.Equal(t, http.StatusNotModified, res.StatusCode, "%s: If-None-Match compares weakly (RFC 9110)", path)
		require.Empty(t, got)
	}
	require.Len(t, etags, 3, "each file its own ETag")

	// Another Handler (another replica, a restart) gives the same ETags.
	other := setup(t).anonymous(t)
	for _, path := range []string{"/console/", "/console/static/app.js"} {
		a, _ := c.do(http.MethodHead, path, nil, nil)
		o, _ := other.do(http.MethodHead, path, nil, nil)
		require.Equal(t, a.Header.Get("ETag"), o.Header.Get("ETag"), path)
	}
}

// TestShorten_CutsAtACharacter: a name quoted in a message is cut at 64 bytes or just before, at
// the start of a UTF-8 character, never inside one: a name of two-byte characters was cut in the
// middle of one, which the message (strconv.Quote) showed as a stray byte (`\xc3`).
func TestShorten_CutsAtACharacter(t *testing.T) {
	t.Parallel()
	require.Equal(t, "abc", console.Shorten("abc"))
	require.Equal(t, strings.Repeat("a", 64), console.Shorten(strings.Repeat("a", 64)))
	require.Equal(t, strings.Repeat("a", 64)+"…", console.Shorten(strings.Repeat("a", 65)))
	require.Equal(t, "a"+strings.Repeat("é", 31)+"…", console.Shorten("a"+strings.Repeat("é", 40)))
	// Every cut of names made of 1- to 4-byte characters, at every offset.
	for _, r := range []string{"é", "€", "😀"} {
		for pad := range 4 {
			for n := 60; n < 70; n++ {
				s := strings.Repeat("a", pad) + strings.Repeat(r, n)
				got := console.Shorten(s)
				require.True(t, utf8.ValidString(got), "%q", got)
				cut := strings.TrimSuffix(got, "…")
				require.True(t, strings.HasPrefix(s, cut))
				require.LessOrEqual(t, len(cut), 64)
				require.Greater(t, len(cut), 64-utf8.UTFMax)
			}
		}
	}
	// A name that is not UTF-8 is cut at 64 bytes, or at most 3 before.
	require.Equal(t, strings.Repeat("\x80", 61)+"…", console.Shorten(strings.Repeat("\x80", 100)))

	// Where a message quotes one.
	b := setup(t)
	c := b.login(t)
	for _, path := range []string{"/console/api/jobs/a" + strings.Repeat("%C3%A9", 40), "/console/static/a" + strings.Repeat("%C3%A9", 40)} {
		res, body := c.do(http.MethodGet, path, nil, nil)
		requireError(t, res, body, http.StatusNotFound, "not_found")
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &e))
		require.Contains(t, e.Error.Message, `"a`+strings.Repeat("é", 31)+`…"`, path)
	}
}
