package console_test

import (
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/llmq/llmq/internal/console"
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
