package console_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/tenant"
)

// documentedStatuses returns the statuses api/openapi.yaml documents for each of the console's
// operations ("METHOD path" → statuses).
func documentedStatuses(t *testing.T) map[string][]int {
	t.Helper()
	raw, err := os.ReadFile("../../api/openapi.yaml")
	require.NoError(t, err)
	var doc struct {
		Paths map[string]map[string]yaml.Node `yaml:"paths"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &doc))
	out := map[string][]int{}
	for _, op := range consoleOperations(t) {
		method, path, _ := strings.Cut(op, " ")
		var o struct {
			Responses map[string]yaml.Node `yaml:"responses"`
		}
		node := doc.Paths[path][strings.ToLower(method)]
		require.NoError(t, node.Decode(&o), op)
		for code := range o.Responses {
			n, err := strconv.Atoi(code)
			require.NoError(t, err, "%s: response %q is not a status", op, code)
			out[op] = append(out[op], n)
		}
		slices.Sort(out[op])
	}
	return out
}

// undriven are the documented statuses no request to the console alone can produce, and why.
var undriven = map[string]string{
	"500":                             "a failure of ours (writeError's default): every error a client can cause is a 4xx",
	"408":                             "a body trickled past the server's read timeout (httpserve's): TestActions_BodyReadRefusals",
	"GET /console/ 503":               "the API's connection cap (api.max_connections), answered before the console",
	"HEAD /console/ 503":              "the API's connection cap (api.max_connections), answered before the console",
	"GET /console/static/{file} 503":  "the API's connection cap (api.max_connections), answered before the console",
	"HEAD /console/static/{file} 503": "the API's connection cap (api.max_connections), answered before the console",
}

// TestRoutes_EveryDocumentedStatusIsProduced drives each of the console's operations into each
// status api/openapi.yaml documents for it (but those in undriven), on real stores. The other
// direction, that every status an operation answers is documented for it, is checked of every
// answer of every test of the package by its server (openapitest.Handler): a status the console
// produces and the description does not list fails the test that saw it.
func TestRoutes_EveryDocumentedStatusIsProduced(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, console.Credential{Name: "default", Provider: "anthropic"}, console.Credential{Name: "unseen", Provider: "openai"})
	documented := documentedStatuses(t)

	// The fixtures, one for each case that changes something.
	require.NoError(t, b.rdb.HSet(ctx, redisscript.CredentialIndexKey(b.prefix), "default",
		redisscript.CredentialTag("anthropic\x00http://sim\x00key")).Err())
	tenants := tenant.NewStore(b.jobs.Pool, nil)
	for _, name := range []string{"acme", "to-revoke", "revoked", "revoked-empty"} {
		_, _, err := tenants.Create(ctx, name, nil)
		require.NoError(t, err)
	}
	for _, name := range []string{"revoked", "revoked-empty"} {
		_, err := tenants.Revoke(ctx, name)
		require.NoError(t, err)
	}
	queued := b.jobs.Create(t, jobstest.Opts{})
	toCancel := b.jobs.Create(t, jobstest.Opts{})
	succeeded := b.jobs.Create(t, jobstest.Opts{})
	b.jobs.Attempt(t, succeeded.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
	toRetry := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	toPurge := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	const missing = "00000000-0000-4000-8000-000000000000"

	c, anon, logout := b.login(t), b.anonymous(t), b.login(t)
	// The ETags of the page and of app.js, which a browser's copy sends back.
	etag := func(path string) http.Header {
		res, _ := anon.do(http.MethodHead, path, nil, nil)
		require.NotEmpty(t, res.Header.Get("ETag"), path)
		return http.Header{"If-None-Match": {res.Header.Get("ETag")}}
	}
	pageCopy, fileCopy := etag("/console/"), etag("/console/static/app.js")
	noCSRF := http.Header{"X-CSRF-Token": {"wrong"}}
	type driven struct {
		op     string // as api/openapi.yaml writes it
		status int
		path   string // the request's; op's path when empty
		body   any
		header http.Header
		c      *client // c when nil
	}
	cases := []driven{
		{op: "GET /console/", status: 200},
		{op: "GET /console/", status: 206, header: http.Header{"Range": {"bytes=0-1"}}},
		{op: "GET /console/", status: 304, header: http.Header{"If-None-Match": {"*"}}},
		{op: "GET /console/", status: 304, header: pageCopy},
		{op: "GET /console/", status: 412, header: http.Header{"If-Match": {`"x"`}}},
		{op: "GET /console/", status: 416, header: http.Header{"Range": {"bytes=100000000-"}}},
		{op: "GET /console/static/{file}", status: 200},
		{op: "GET /console/static/{file}", status: 206, header: http.Header{"Range": {"bytes=0-1"}}},
		{op: "GET /console/static/{file}", status: 304, header: http.Header{"If-None-Match": {"*"}}},
		{op: "GET /console/static/{file}", status: 304, header: fileCopy},
		{op: "GET /console/static/{file}", status: 412, header: http.Header{"If-Match": {`"x"`}}},
		{op: "GET /console/static/{file}", status: 416, header: http.Header{"Range": {"bytes=100000000-"}}},
		{op: "GET /console/static/{file}", status: 404, path: "/console/static/nope.js"},
		{op: "POST /console/api/login", status: 200, body: map[string]string{"token": b.token}, c: b.anonymous(t)},
		{op: "POST /console/api/login", status: 400, c: anon},
		{op: "POST /console/api/login", status: 401, body: map[string]string{"token": "nonsense"}, c: anon},
		{op: "POST /console/api/login", status: 403, body: map[string]string{"token": b.token}, c: b.anonymous(t),
			header: http.Header{"Origin": {"https://elsewhere.example"}}},
		{op: "POST /console/api/logout", status: 200, c: logout},
		{op: "GET /console/api/session", status: 200},
		{op: "GET /console/api/overview", status: 200},
		{op: "GET /console/api/jobs", status: 200},
		{op: "GET /console/api/jobs", status: 400, path: "/console/api/jobs?limit=0"},
		{op: "GET /console/api/jobs/{id}", status: 200, path: "/console/api/jobs/" + queued.ID},
		{op: "GET /console/api/jobs/{id}", status: 404, path: "/console/api/jobs/" + missing},
		{op: "GET /console/api/jobs/{id}/live", status: 404, path: "/console/api/jobs/" + missing + "/live"},
		{op: "POST /console/api/jobs/{id}/cancel", status: 200, path: "/console/api/jobs/" + toCancel.ID + "/cancel"},
		{op: "POST /console/api/jobs/{id}/cancel", status: 404, path: "/console/api/jobs/" + missing + "/cancel"},
		{op: "POST /console/api/jobs/{id}/cancel", status: 409, path: "/console/api/jobs/" + succeeded.ID + "/cancel"},
		{op: "GET /console/api/dead", status: 200},
		{op: "GET /console/api/dead", status: 400, path: "/console/api/dead?reason=bored"},
		{op: "POST /console/api/dead/retry", status: 200, body: map[string]any{"ids": []string{toRetry.ID}}},
		{op: "POST /console/api/dead/retry", status: 400, body: map[string]any{"ids": []string{}}},
		{op: "POST /console/api/dead/purge", status: 200, body: map[string]any{"ids": []string{toPurge.ID}}},
		{op: "POST /console/api/dead/purge", status: 400, body: map[string]any{"ids": []string{}}},
		{op: "GET /console/api/credentials", status: 200},
		{op: "POST /console/api/credentials/{name}/resume", status: 200, path: "/console/api/credentials/default/resume"},
		{op: "POST /console/api/credentials/{name}/resume", status: 404, path: "/console/api/credentials/nope/resume"},
		{op: "POST /console/api/credentials/{name}/resume", status: 409, path: "/console/api/credentials/unseen/resume"},
		{op: "GET /console/api/tenants", status: 200},
		{op: "POST /console/api/tenants", status: 201, body: map[string]string{"name": "fresh"}},
		{op: "POST /console/api/tenants", status: 400, body: map[string]string{"name": ""}},
		{op: "POST /console/api/tenants", status: 409, body: map[string]string{"name": "acme"}},
		{op: "POST /console/api/tenants/{name}/revoke", status: 200, path: "/console/api/tenants/to-revoke/revoke"},
		{op: "POST /console/api/tenants/{name}/revoke", status: 400, path: "/console/api/tenants/acme/revoke", body: rawBody("{")},
		{op: "POST /console/api/tenants/{name}/revoke", status: 404, path: "/console/api/tenants/nope/revoke"},
		{op: "POST /console/api/tenants/{name}/rotate", status: 200, path: "/console/api/tenants/acme/rotate", body: map[string]any{}},
		{op: "POST /console/api/tenants/{name}/rotate", status: 400, path: "/console/api/tenants/acme/rotate", body: map[string]any{"overlap_seconds": -1}},
		{op: "POST /console/api/tenants/{name}/rotate", status: 404, path: "/console/api/tenants/nope/rotate", body: map[string]any{}},
		{op: "POST /console/api/tenants/{name}/rotate", status: 409, path: "/console/api/tenants/revoked/rotate", body: map[string]any{}},
		{op: "POST /console/api/tenants/{name}/weight", status: 200, path: "/console/api/tenants/acme/weight", body: map[string]any{"weight": 2}},
		{op: "POST /console/api/tenants/{name}/weight", status: 400, path: "/console/api/tenants/acme/weight", body: map[string]any{"weight": 0}},
		{op: "POST /console/api/tenants/{name}/weight", status: 404, path: "/console/api/tenants/nope/weight", body: map[string]any{"weight": 2}},
		{op: "POST /console/api/tenants/{name}/delete", status: 200, path: "/console/api/tenants/revoked-empty/delete"},
		{op: "POST /console/api/tenants/{name}/delete", status: 404, path: "/console/api/tenants/nope/delete"},
		{op: "POST /console/api/tenants/{name}/delete", status: 409, path: "/console/api/tenants/acme/delete"},
		{op: "GET /console/api/audit", status: 200},
		{op: "GET /console/api/audit", status: 400, path: "/console/api/audit?after=x"},
	}
	// 413: a body past the console's 1 MiB, for each action that reads one.
	tooLarge := rawBody(`{"x":"` + strings.Repeat("a", 1<<20) + `"}`)
	for _, op := range []string{"POST /console/api/login", "POST /console/api/tenants", "POST /console/api/tenants/{name}/revoke",
		"POST /console/api/tenants/{name}/rotate", "POST /console/api/tenants/{name}/weight", "POST /console/api/dead/retry",
		"POST /console/api/dead/purge"} {
		tc := driven{op: op, status: http.StatusRequestEntityTooLarge, body: tooLarge}
		if op == "POST /console/api/login" {
			tc.c = anon
		}
		cases = append(cases, tc)
	}
	// HEAD is its GET's answer without a body.
	for _, tc := range slices.Clone(cases) {
		if method, path, _ := strings.Cut(tc.op, " "); method == http.MethodGet && !strings.HasSuffix(path, "/live") {
			tc.op = http.MethodHead + " " + path
			cases = append(cases, tc)
		}
	}
	// Every operation behind a session: 401 without one; every action: 403 without its CSRF token.
	for op, statuses := range documented {
		method, path, _ := strings.Cut(op, " ")
		if path == "/console/api/login" {
			continue
		}
		if slices.Contains(statuses, http.StatusUnauthorized) {
			cases = append(cases, driven{op: op, status: http.StatusUnauthorized, c: anon})
		}
		if slices.Contains(statuses, http.StatusForbidden) && method == http.MethodPost {
			cases = append(cases, driven{op: op, status: http.StatusForbidden, header: noCSRF})
		}
	}

	produced := map[string]bool{}
	for _, tc := range cases {
		method, path, _ := strings.Cut(tc.op, " ")
		if tc.path == "" {
			tc.path = strings.NewReplacer("{id}", queued.ID, "{name}", "acme", "{file}", "app.js").Replace(path)
		}
		cl := c
		if tc.c != nil {
			cl = tc.c
		}
		res, body := cl.do(method, tc.path, tc.body, tc.header)
		require.Equal(t, tc.status, res.StatusCode, "%s %s: %s", method, tc.path, body)
		produced[fmt.Sprintf("%s %d", tc.op, tc.status)] = true
	}
	// The event streams' 200s.
	var d struct {
		Job struct {
			ID string `json:"id"`
		} `json:"job"`
	}
	c.stream(t, "/console/api/jobs/"+queued.ID+"/live", "job").next(t, &d)
	require.Equal(t, queued.ID, d.Job.ID)
	produced["GET /console/api/jobs/{id}/live 200"] = true
	var ov map[string]any
	c.stream(t, "/console/api/overview/live", "overview").next(t, &ov)
	produced["GET /console/api/overview/live 200"] = true

	// 503: the same operations, with Postgres out of reach (a session's lookup, a login's).
	proxy, url := pgtest.NewProxy(t, b.jobs.URL)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cut := &testBundle{jobs: b.jobs, rdb: b.rdb, prefix: b.prefix, token: b.token}
	cc, _ := cut.serve(t, func(cfg *console.Config) { cfg.Pool, cfg.Jobs = pool, jobs.NewStore(pool, nil) })
	canon := cut.anonymous(t)
	proxy.Cut()
	for op, statuses := range documented {
		if !slices.Contains(statuses, http.StatusServiceUnavailable) || undriven[op+" 503"] != "" {
			continue
		}
		method, path, _ := strings.Cut(op, " ")
		path = strings.NewReplacer("{id}", queued.ID, "{name}", "acme").Replace(path)
		var body any
		cl := cc
		if path == "/console/api/login" {
			body, cl = map[string]string{"token": b.token}, canon
		}
		res, out := cl.do(method, path, body, nil)
		require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, "%s: %s", op, out)
		produced[op+" 503"] = true
	}

	var missed []string
	for op, statuses := range documented {
		for _, status := range statuses {
			key := fmt.Sprintf("%s %d", op, status)
			if !produced[key] && undriven[key] == "" && undriven[strconv.Itoa(status)] == "" {
				missed = append(missed, key)
			}
		}
	}
	slices.Sort(missed)
	require.Empty(t, missed, "documented, and no case of this test produces it")
}
