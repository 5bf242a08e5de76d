package llmsim_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/llmsim"
)

// t0 is the fake clock's start: 2026-01-02T03:04:05Z.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// sequence returns a Rand that yields vs in order, then repeats the last.
func sequence(vs ...float64) func() float64 {
	i := 0
	return func() float64 {
		v := vs[min(i, len(vs)-1)]
		i++
		return v
	}
}

type testBundle struct {
	sim   *llmsim.Server
	ts    *httptest.Server
	clock *clocktest.Clock
}

// setup starts a simulator behind a real HTTP server; cfg.Now defaults to a
// fake clock at t0.
func setup(t *testing.T, cfg llmsim.Config) *testBundle {
	t.Helper()
	clock := clocktest.New(t0)
	if cfg.Now == nil {
		cfg.Now = clock.Now
	}
	sim := llmsim.New(cfg)
	ts := httptest.NewServer(sim)
	t.Cleanup(ts.Close)
	return &testBundle{sim: sim, ts: ts, clock: clock}
}

type result struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into a generic map.
func (r result) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

// errType returns error.type of either provider's error body.
func (r result) errType(t *testing.T) string {
	t.Helper()
	e, ok := r.json(t)["error"].(map[string]any)
	require.True(t, ok, "no error object in %s", r.body)
	s, _ := e["type"].(string)
	return s
}

const helloBody = `{"model":"sim-model","max_tokens":64,"messages":[{"role":"user","content":"Hello, simulator!"}]}`

func (b *testBundle) do(t *testing.T, ctx context.Context, method, path string, header map[string]string, body string) (result, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, b.ts.URL+path, strings.NewReader(body))
	require.NoError(t, err)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := b.ts.Client().Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{status: resp.StatusCode, header: resp.Header, body: data}, nil
}

func (b *testBundle) mustDo(t *testing.T, method, path string, header map[string]string, body string) result {
	t.Helper()
	r, err := b.do(t, t.Context(), method, path, header, body)
	require.NoError(t, err)
	return r
}

// anthropic posts body to /v1/messages with key (none when empty).
func (b *testBundle) anthropic(t *testing.T, key, body string) result {
	t.Helper()
	h := map[string]string{"anthropic-version": "2023-06-01", "content-type": "application/json"}
	if key != "" {
		h["x-api-key"] = key
	}
	return b.mustDo(t, http.MethodPost, "/v1/messages", h, body)
}

// openai posts body to /v1/chat/completions with key (none when empty).
func (b *testBundle) openai(t *testing.T, key, body string) result {
	t.Helper()
	h := map[string]string{"content-type": "application/json"}
	if key != "" {
		h["authorization"] = "Bearer " + key
	}
	return b.mustDo(t, http.MethodPost, "/v1/chat/completions", h, body)
}

// setFaults posts a faults body and requires it to be accepted.
func (b *testBundle) setFaults(t *testing.T, body string) {
	t.Helper()
	r := b.mustDo(t, http.MethodPost, "/_sim/faults", nil, body)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
}

func (b *testBundle) stats(t *testing.T) llmsim.Stats {
	t.Helper()
	r := b.mustDo(t, http.MethodGet, "/_sim/stats", nil, "")
	require.Equal(t, http.StatusOK, r.status)
	var st llmsim.Stats
	require.NoError(t, json.Unmarshal(r.body, &st))
	return st
}
