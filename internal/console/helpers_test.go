package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// testBundle is a console on a database and a Redis prefix of its own, with one operator.
type testBundle struct {
	jobs   *jobstest.Bundle
	rdb    *redis.Client
	prefix string
	srv    *httptest.Server
	h      *console.Handler
	token  string // alice's operator token

	mu       sync.Mutex
	canceled []string // the credentials of the jobs the console canceled, as told to Config.Canceled
}

func setup(t *testing.T, creds ...console.Credential) *testBundle {
	t.Helper()
	return setupTasks(t, nil, creds...)
}

// setupTasks is setup with the console's Config.Tasks.
func setupTasks(t *testing.T, tasks *dispatch.Tasks, creds ...console.Credential) *testBundle {
	t.Helper()
	return setupConfig(t, func(cfg *console.Config) { cfg.Tasks, cfg.Credentials = tasks, creds })
}

// setupConfig is setup with the console's Config as configure leaves it.
func setupConfig(t *testing.T, configure func(*console.Config)) *testBundle {
	t.Helper()
	b := &testBundle{jobs: jobstest.New(t), rdb: redistest.Client(t), prefix: redistest.Prefix(t)}
	cfg := console.Config{Pool: b.jobs.Pool, Jobs: b.jobs.Store, Redis: b.rdb, RedisPrefix: b.prefix,
		Canceled: func(credential string) {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.canceled = append(b.canceled, credential)
		}}
	configure(&cfg)
	h, err := console.New(cfg)
	require.NoError(t, err)
	b.h = h
	// Every answer of every test must be one that api/openapi.yaml describes.
	b.srv = httptest.NewServer(openapitest.Handler(t, h))
	t.Cleanup(b.srv.Close)
	_, b.token, err = operator.NewStore(b.jobs.Pool, nil).Create(context.Background(), "alice")
	require.NoError(t, err)
	return b
}

// client is a browser's view: a cookie jar, and the CSRF token the page keeps.
type client struct {
	t    *testing.T
	base string
	http *http.Client
	csrf string
}

func (b *testBundle) anonymous(t *testing.T) *client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &client{t: t, base: b.srv.URL, http: &http.Client{Jar: jar}}
}

// login returns a client logged in as alice.
func (b *testBundle) login(t *testing.T) *client {
	c := b.anonymous(t)
	res, body := c.do(http.MethodPost, "/console/api/login", map[string]string{"token": b.token}, nil)
	require.Equal(t, http.StatusOK, res.StatusCode, body)
	var s struct {
		CSRF string `json:"csrf_token"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &s))
	require.NotEmpty(t, s.CSRF)
	c.csrf = s.CSRF
	return c
}

// do sends a request (body as JSON when not nil) with the client's CSRF token unless header
// overrides it, and returns the answer and its body.
func (c *client) do(method, path string, body any, header http.Header) (*http.Response, string) {
	c.t.Helper()
	var r io.Reader
	if raw, ok := body.(rawBody); ok {
		r = strings.NewReader(string(raw))
	} else if body != nil {
		b, err := json.Marshal(body)
		require.NoError(c.t, err)
		r = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, c.base+path, r)
	require.NoError(c.t, err)
	if c.csrf != "" && method != http.MethodGet {
		req.Header.Set("X-CSRF-Token", c.csrf)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := c.http.Do(req)
	require.NoError(c.t, err)
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	require.NoError(c.t, err)
	return res, string(out)
}

// rawBody is a request body sent as it is, not as JSON.
type rawBody string

// json sends a request and decodes a 2xx answer into v.
func (c *client) json(method, path string, body, v any) {
	c.t.Helper()
	res, out := c.do(method, path, body, nil)
	require.Less(c.t, res.StatusCode, 300, out)
	require.NoError(c.t, json.Unmarshal([]byte(out), v), out)
}

// requireError checks an answer's status and error type.
func requireError(t *testing.T, res *http.Response, body string, status int, typ string) {
	t.Helper()
	require.Equal(t, status, res.StatusCode, body)
	var e struct {
		Error struct{ Type, Message string }
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	require.Equal(t, typ, e.Error.Type, body)
	require.NotEmpty(t, e.Error.Message)
}

func (b *testBundle) audit(t *testing.T) []audit.Entry {
	t.Helper()
	list, err := audit.List(context.Background(), b.jobs.Pool, audit.ListParams{Limit: 100})
	require.NoError(t, err)
	return list
}

// storeBehindProxy is a job store on the bundle's database reached through a proxy the test can
// cut (a Postgres outage seen by the console alone).
func (b *testBundle) storeBehindProxy(t *testing.T) (*pgtest.Proxy, *jobs.Store) {
	t.Helper()
	proxy, proxied := pgtest.NewProxy(t, b.jobs.URL)
	pool, err := pgxpool.New(context.Background(), proxied)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return proxy, jobs.NewStore(pool, nil)
}
