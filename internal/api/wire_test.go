package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/httpserve/httpservetest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
)

const wireYAML = `
database_url: %s
redis_url: %s
api: { allow_anonymous: false%s }
worker: { queue: %s }
credentials:
  - { name: default, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_env: K }
`

func parseWire(t *testing.T, dbURL, queue, apiExtra string) (*config.Config, error) {
	t.Helper()
	return config.Parse(fmt.Appendf(nil, wireYAML, dbURL, redistest.URL(), apiExtra, queue),
		func(k string) string {
			if k == "K" {
				return "sk-wire-test"
			}
			return ""
		})
}

// fromConfig is the server FromConfig wires from cfg, on a pool of dbURL's, both closed when the
// test ends.
func fromConfig(t *testing.T, dbURL string, cfg *config.Config) (*pgxpool.Pool, *Server) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	srv, closeAPI, err := FromConfig(cfg, pool, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, closeAPI()) })
	return pool, srv
}

// TestFromConfig_TenantsAndSubmitRate checks the wiring of the config file: bearer tokens
// resolve against the tenants table, anonymous access follows api.allow_anonymous, and
// api.tenant_submit_rate limits each tenant.
func TestFromConfig_TenantsAndSubmitRate(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	queue := redistest.Queue(t, redistest.URL())
	cfg, err := parseWire(t, dbURL, queue, ", tenant_submit_rate: { requests_per_second: 0.01, burst: 1 }")
	require.NoError(t, err)
	require.Equal(t, &config.SubmitRate{RequestsPerSecond: 0.01, Burst: 1}, cfg.API.TenantSubmitRate)
	pool, srv := fromConfig(t, dbURL, cfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	// FromConfig keys the rate under "llmq:": a tenant name of this test's own keeps it apart.
	name := "wire-" + redistest.Rand()
	rdb := redistest.Client(t)
	t.Cleanup(func() {
		_ = rdb.Del(context.Background(), "llmq:tenant:{"+name+"}:submit").Err()
	})
	_, token, err := tenant.NewStore(pool, nil).Create(context.Background(), name, nil)
	require.NoError(t, err)
	auth := map[string]string{"Authorization": "Bearer " + token}

	require.Equal(t, http.StatusUnauthorized, do(t, hs.URL, http.MethodPost, "/v1/jobs", minimalSubmit, nil).status, "anonymous is off")
	require.Equal(t, http.StatusAccepted, do(t, hs.URL, http.MethodPost, "/v1/jobs", minimalSubmit, auth).status)
	r := do(t, hs.URL, http.MethodPost, "/v1/jobs", minimalSubmit, auth)
	require.Equal(t, http.StatusTooManyRequests, r.status)
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err)
	require.Greater(t, secs, 90)
}

// TestFromConfigWith_SubmitRateUnderPrefix: the tenants' submit rate is kept under
// Options.RedisPrefix, as llmq's other keys are, so that servers of different prefixes on one
// Redis (tests in their own namespaces) do not spend one budget: a tenant of the same name
// limited in one is not in the other.
func TestFromConfigWith_SubmitRateUnderPrefix(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	queue := redistest.Queue(t, redistest.URL())
	cfg, err := parseWire(t, dbURL, queue, ", tenant_submit_rate: { requests_per_second: 0.01, burst: 1 }")
	require.NoError(t, err)
	name := "wire-" + redistest.Rand()
	rdb := redistest.Client(t)
	t.Cleanup(func() {
		_ = rdb.Del(context.Background(), "llmq:tenant:{"+name+"}:submit").Err() // left by a failure
	})
	pool, err := pgxpool.New(context.Background(), dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, token, err := tenant.NewStore(pool, nil).Create(context.Background(), name, nil)
	require.NoError(t, err)
	auth := map[string]string{"Authorization": "Bearer " + token}

	for i, prefix := range []string{redistest.Prefix(t), redistest.Prefix(t)} {
		srv, closeAPI, err := FromConfigWith(cfg, pool, prometheus.NewRegistry(), nil, Options{RedisPrefix: prefix})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, closeAPI()) })
		hs := httptest.NewServer(srv)
		t.Cleanup(hs.Close)
		require.Equal(t, http.StatusAccepted, do(t, hs.URL, http.MethodPost, "/v1/jobs", minimalSubmit, auth).status, "prefix %d", i)
		require.Equal(t, int64(1), rdb.Exists(context.Background(), prefix+"tenant:{"+name+"}:submit").Val(), "prefix %d", i)
	}
}

func TestConfig_TenantSubmitRateValidated(t *testing.T) {
	t.Parallel()
	cfg, err := parseWire(t, pgtest.DefaultURL, "q", "")
	require.NoError(t, err)
	require.Nil(t, cfg.API.TenantSubmitRate, "off by default")
	for _, bad := range []string{
		", tenant_submit_rate: { requests_per_second: 0, burst: 1 }",
		", tenant_submit_rate: { requests_per_second: 1 }",
		", tenant_submit_rate: { requests_per_second: -1, burst: 5 }",
		", tenant_submit_rate: {}",
	} {
		_, err := parseWire(t, pgtest.DefaultURL, "q", bad)
		require.ErrorContains(t, err, "api.tenant_submit_rate", bad)
	}
	// A request rate only: token limits belong to credentials.
	_, err = parseWire(t, pgtest.DefaultURL, "q", ", tenant_submit_rate: { requests_per_second: 1, burst: 1, tokens_per_minute: 5 }")
	require.ErrorContains(t, err, "tokens_per_minute")
}

// TestFromConfig_ConsoleEventWriteTimeout: api.event_write_timeout bounds each event's write on
// the console's streams too: a client that never reads a job page carrying a 2 MB result is cut
// off after the configured second, not after the console's default 10 s (no write deadline the
// server set was further ahead than the configured second; the time the cut-off takes is the
// machine's, and not the check).
func TestFromConfig_ConsoleEventWriteTimeout(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	cfg, err := parseWire(t, dbURL, redistest.Queue(t, redistest.URL()), ", event_write_timeout: 1s")
	require.NoError(t, err)
	pool, srv := fromConfig(t, dbURL, cfg)
	hs := httptest.NewUnstartedServer(srv)
	ln := httpservetest.NewStallListener(hs.Listener)
	hs.Listener = ln
	hs.Start()
	t.Cleanup(hs.Close)

	b := &testBundle{store: jobs.NewStore(pool, nil)}
	job := b.create(t, "")
	result, err := json.Marshal(map[string]string{"text": strings.Repeat("x", 2<<20)})
	require.NoError(t, err)
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: result})
	_, token, err := operator.NewStore(pool, nil).Create(context.Background(), "alice")
	require.NoError(t, err)
	login := do(t, hs.URL, http.MethodPost, "/console/api/login", `{"token":"`+token+`"}`, nil)
	require.Equal(t, http.StatusOK, login.status)
	cookie := (&http.Response{Header: login.header}).Cookies()
	require.NotEmpty(t, cookie)

	c := httpservetest.Dial(t, strings.TrimPrefix(hs.URL, "http://"), 4<<10)
	c.Send(t, http.MethodGet, "/console/api/jobs/"+job.ID+"/live", "Cookie: "+cookie[0].String())
	ln.WaitClosed(t, c, "the console's stream still writes to a client that reads nothing")
	span := ln.WriteDeadlineSpan(c)
	require.Positive(t, span, "the console's stream set no write deadline")
	require.LessOrEqual(t, span, time.Second, "a write deadline beyond the configured bound")
	resp := c.Head(t)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
}

// TestFromConfig_ConsolePathsUnderCleanPaths: the console mounted in the API server keeps its
// paths under Server.ServeHTTP's refusal of unclean ones: /console still redirects to /console/
// (the ServeMux's redirect of a subtree's root, a clean path), its page (with a query) and static
// files still answer, and only a path with a dot or an empty segment is the API's 404.
func TestFromConfig_ConsolePathsUnderCleanPaths(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	cfg, err := parseWire(t, dbURL, redistest.Queue(t, redistest.URL()), "")
	require.NoError(t, err)
	_, srv := fromConfig(t, dbURL, cfg)
	// Each answer must be one api/openapi.yaml describes (the redirect of /console included).
	hs := httptest.NewServer(openapitest.Handler(t, srv))
	t.Cleanup(hs.Close)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string) *http.Response {
		ctx, cancel := context.WithTimeout(context.Background(), httpservetest.Wait)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+path, nil)
		require.NoError(t, err)
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		_, err = io.Copy(io.Discard, resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp
	}
	resp := get("/console")
	require.Contains(t, []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect}, resp.StatusCode)
	require.Equal(t, "/console/", resp.Header.Get("Location"))
	for _, p := range []string{"/console/", "/console/?tab=dead", "/console/static/app.js", "/console/static/app.css"} {
		require.Equal(t, http.StatusOK, get(p).StatusCode, p)
	}
	for _, p := range []string{"/console/static/../", "//console/", "/console/./static/app.js"} {
		resp := get(p)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, p)
		require.Empty(t, resp.Header.Get("Location"), p)
	}
}

// TestFromConfig_ConsoleLivePagesUnderMaxStreams: the console's live pages (a job's, the
// overview's) take the server's event stream places (api.max_streams) as the API's streams do:
// over the cap one is refused 503 overloaded with Retry-After, and a page that closes gives its
// place back. They were not counted: live pages left open by many operators, or a script, held
// connections past the cap.
func TestFromConfig_ConsoleLivePagesUnderMaxStreams(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	cfg, err := parseWire(t, dbURL, redistest.Queue(t, redistest.URL()), ", max_streams: 1")
	require.NoError(t, err)
	pool, srv := fromConfig(t, dbURL, cfg)
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)

	job := (&testBundle{store: jobs.NewStore(pool, nil)}).create(t, "")
	_, token, err := operator.NewStore(pool, nil).Create(context.Background(), "alice")
	require.NoError(t, err)
	login := do(t, hs.URL, http.MethodPost, "/console/api/login", `{"token":"`+token+`"}`, nil)
	require.Equal(t, http.StatusOK, login.status)
	cookie := (&http.Response{Header: login.header}).Cookies()
	require.NotEmpty(t, cookie)
	session := map[string]string{"Cookie": cookie[0].String()}
	// open opens a live page; its stream stays open until the returned function closes it.
	open := func(path string) (*http.Response, func()) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, hs.URL+path, nil)
		require.NoError(t, err)
		req.Header.Set("Cookie", cookie[0].String())
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		return resp, func() { cancel(); resp.Body.Close() }
	}

	first, closeFirst := open("/console/api/jobs/" + job.ID + "/live")
	defer closeFirst()
	require.Equal(t, http.StatusOK, first.StatusCode)
	for _, path := range []string{"/console/api/jobs/" + job.ID + "/live", "/console/api/overview/live"} {
		refused := do(t, hs.URL, http.MethodGet, path, "", session)
		require.Equal(t, http.StatusServiceUnavailable, refused.status, path)
		require.Equal(t, "overloaded", refused.body["error"].(map[string]any)["type"], path)
		require.Equal(t, "5", refused.header.Get("Retry-After"), path)
	}
	// A tenant's stream (authenticated: one that is not takes no place, and is refused 401).
	_, tenantToken, err := tenant.NewStore(pool, nil).Create(context.Background(), "acme", nil)
	require.NoError(t, err)
	acmes := (&testBundle{store: jobs.NewStore(pool, nil)}).create(t, "acme")
	events := do(t, hs.URL, http.MethodGet, "/v1/jobs/"+acmes.ID+"/events", "", map[string]string{"Authorization": "Bearer " + tenantToken})
	require.Equal(t, http.StatusServiceUnavailable, events.status, "the API's streams share the cap")

	closeFirst()
	require.Eventually(t, func() bool {
		resp, closeIt := open("/console/api/overview/live")
		defer closeIt()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "the closed page's place is given back")
}
