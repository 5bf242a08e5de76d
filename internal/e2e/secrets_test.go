package e2e_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/worker"
)

// leakyProvider is an Anthropic-shaped provider that echoes the API key it receives in its error
// bodies and headers, as careless providers and proxies do: first a 503 (retried) whose HTML body
// has the key across byte 200, where an error excerpt is cut, then a 401 (final). It records the
// keys it was sent.
type leakyProvider struct {
	calls atomic.Int64
	mu    sync.Mutex
	keys  []string
}

func (p *leakyProvider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-Api-Key")
	p.mu.Lock()
	p.keys = append(p.keys, key)
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Echo-Api-Key", key)
	if p.calls.Add(1) == 1 {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "<html>%s overloaded for key %s</html>", strings.Repeat("~", 144), key)
		return
	}
	w.WriteHeader(http.StatusUnauthorized)
	fmt.Fprintf(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key: %s"}}`, key)
}

// TestSecrets_KeyIsNeverLoggedOrStored runs jobs with a recognisable provider key through the
// API, a worker and providers (one that succeeds, one that echoes the key in its errors, one
// that answers with a spend cap), then looks for the key everywhere llmq writes: the API's and
// the worker's logs (at debug level), every API answer, a pg_dump of the database, every key of
// Redis (dumped by type, once while tasks wait and once at the end), and both /metrics. It is in
// none. The prompt is in the database (as it must be) and in no log line.
func TestSecrets_KeyIsNeverLoggedOrStored(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	canary := "sk-ant-SECRET-CANARY-" + redistest.Rand()
	prompt := "PROMPT-CANARY-" + redistest.Rand()

	sim := llmsim.New(llmsim.Config{})
	simSrv := httptest.NewServer(sim)
	t.Cleanup(simSrv.Close)
	leaky := &leakyProvider{}
	leakySrv := httptest.NewServer(leaky)
	t.Cleanup(leakySrv.Close)
	capped := httptest.NewServer(llmsim.New(llmsim.Config{Faults: llmsim.Faults{SpendCap: true}}))
	t.Cleanup(capped.Close)
	dbURL := pgtest.URL(t)
	queue := redistest.Queue(t, redistest.URL())
	prefix := redistest.Prefix(t)
	cfg, err := config.Parse(fmt.Appendf(nil, `
database_url: %s
redis_url: %s
api: { allow_anonymous: true, tenant_submit_rate: { requests_per_second: 1, burst: 100 } }
worker: { concurrency: 10, queue: %s, sweep_interval: 100ms, metrics_listen: "off" }
credentials:
  - { name: default, provider: anthropic, base_url: %s, api_key_env: CANARY_KEY, limits: { requests_per_second: 50, burst: 10 } }
  - { name: leaky, provider: anthropic, base_url: %s, api_key_env: CANARY_KEY }
  - { name: capped, provider: anthropic, base_url: %s, api_key_env: CANARY_KEY }
retry: { max_attempts: 3, base_delay: 10ms, max_delay: 50ms }
`, dbURL, redistest.URL(), queue, simSrv.URL, leakySrv.URL, capped.URL), func(k string) string {
		if k == "CANARY_KEY" {
			return canary
		}
		return ""
	})
	require.NoError(t, err)
	rdb := redistest.Client(t)
	t.Cleanup(func() { _ = rdb.Del(context.Background(), "llmq:tenant:{default}:submit").Err() })

	// The API, logging everything.
	var apiLogs, workerLogs logtest.Buffer
	debug := &slog.HandlerOptions{Level: slog.LevelDebug}
	pool, err := openPool(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	apiReg := prometheus.NewRegistry()
	apiSrv, shutdownAPI, err := api.FromConfig(cfg, pool, apiReg, slog.New(slog.NewJSONHandler(&apiLogs, debug)))
	require.NoError(t, err)
	hs := httptest.NewServer(apiSrv)
	t.Cleanup(hs.Close)
	// Closed before its server and pool (cleanups run last in, first out), also on a failure.
	closeAPI := sync.OnceValue(shutdownAPI)
	t.Cleanup(func() { _ = closeAPI() })
	var answers strings.Builder // every API answer, headers and body, unless record is off
	record := true
	call := func(method, path, body string, header map[string]string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, hs.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Less(t, resp.StatusCode, 500, "%s %s: %s", method, path, raw)
		if record {
			fmt.Fprintf(&answers, "%s %s -> %d %v\n%s\n", method, path, resp.StatusCode, resp.Header, raw)
		}
		return string(raw)
	}
	idOf := func(raw string) string {
		_, rest, ok := strings.Cut(raw, `"id":"`)
		require.True(t, ok, raw)
		return rest[:36]
	}
	ok := idOf(call(http.MethodPost, "/v1/jobs", anthropicBody(prompt), map[string]string{"Idempotency-Key": "secret-1"}))
	call(http.MethodPost, "/v1/jobs", anthropicBody(prompt), map[string]string{"Idempotency-Key": "secret-1"}) // replay
	echoed := idOf(call(http.MethodPost, "/v1/jobs", `{"credential":"leaky","request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"`+prompt+`"}]}}`, nil))
	dead := idOf(call(http.MethodPost, "/v1/jobs", `{"credential":"capped","request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"`+prompt+`"}]}}`, nil))
	// A client pasting the key where a credential name goes gets a 400 that names its own input
	// back (not recorded: the client sent it), and nothing of it is logged or stored.
	record = false
	require.Contains(t, call(http.MethodPost, "/v1/jobs", `{"credential":"`+canary+`","request":{}}`, nil), "unknown_credential")
	record = true
	waiting := dumpRedis(t, queue, prefix)
	require.Contains(t, waiting, "asynq:{"+queue+"}:t:"+ok, "the dump holds the waiting tasks")
	require.Contains(t, waiting, "llmq:tenant:{default}:submit", "and the tenant's submit rate")

	// A worker, logging everything, runs them.
	wpool, err := openPool(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(wpool.Close)
	workerReg := prometheus.NewRegistry()
	w, err := worker.New(ctx, cfg, wpool, worker.Options{Logger: slog.New(slog.NewJSONHandler(&workerLogs, debug)),
		Registerer: workerReg, RedisPrefix: prefix})
	require.NoError(t, err)
	wctx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	stopped := false
	stop := func() error {
		stopWorker()
		if stopped {
			return nil
		}
		stopped = true
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("the worker did not stop within 30s of its context's end")
		}
	}
	// Stopped before its pool closes, also on a failure: wpool.Close waits for the connections a
	// running worker holds, for ever.
	t.Cleanup(func() { _ = stop() })
	for id, want := range map[string]string{ok: "succeeded", echoed: "failed", dead: "dead"} {
		require.Eventually(t, func() bool {
			return strings.Contains(call(http.MethodGet, "/v1/jobs/"+id, "", nil), `"status":"`+want+`"`)
		}, 30*time.Second, 20*time.Millisecond, "job %s %s", id, want)
		call(http.MethodGet, "/v1/jobs/"+id+"/events", "", map[string]string{"Last-Event-ID": "0"})
	}
	require.Contains(t, call(http.MethodGet, "/v1/jobs/"+echoed, "", nil), "[redacted]", "the echoed key was redacted")
	call(http.MethodDelete, "/v1/jobs/"+ok, "", nil) // 409: terminal
	require.NoError(t, stop())
	require.NoError(t, closeAPI())

	// The key went where it must: to the providers.
	leaky.mu.Lock()
	require.Equal(t, []string{canary, canary}, leaky.keys)
	leaky.mu.Unlock()
	require.Equal(t, 1, sim.Stats().Requests)

	dump, err := exec.CommandContext(ctx, "pg_dump", "--no-owner", "--dbname="+dbURL).Output()
	require.NoError(t, err, "pg_dump")
	everything := map[string]string{
		"api logs":        apiLogs.String(),
		"worker logs":     workerLogs.String(),
		"api answers":     answers.String(),
		"pg_dump":         string(dump),
		"redis (waiting)": waiting,
		"redis (after)":   dumpRedis(t, queue, prefix),
		"api /metrics":    call(http.MethodGet, "/metrics", "", nil),
		"worker /metrics": serveMetrics(t, workerReg),
	}
	for where, text := range everything {
		require.NotContains(t, text, canary, "the provider key leaked into the %s", where)
		for i := 0; i+8 <= len(canary); i++ { // no 8 characters of it, in any letter case
			part := strings.ToLower(canary[i : i+8])
			if !strings.Contains(strings.ToLower(prompt), part) && strings.Contains(strings.ToLower(text), part) { // "-canary-" is in the prompt too
				t.Fatalf("part of the provider key (%q) leaked into the %s", part, where)
			}
		}
	}
	for _, where := range []string{"api logs", "worker logs"} {
		require.NotContains(t, everything[where], prompt, "the prompt (or the result echoing it) was logged in the %s", where)
	}

	// The places searched are not empty: they hold what they should.
	require.Contains(t, everything["pg_dump"], prompt, "the dump holds the stored requests")
	require.Contains(t, everything["pg_dump"], echoed)
	for _, id := range []string{echoed, dead} {
		require.Contains(t, everything["worker logs"], id, "the worker logged the outcome of %s", id)
	}
	require.Contains(t, everything["redis (after)"], prefix, "the dump holds the limiter's keys")
	require.Contains(t, everything["worker /metrics"], "llmq_")
}

// dumpRedis returns every key of the test Redis with its value, read according to its type, so
// that a search covers strings, hashes, lists, sets, sorted sets and streams alike. It reads the
// whole database but for the namespaces other tests and benchmark runs own (othersKey): a
// stricter search than this test's prefix and queue alone, and the canary is unique to this run.
func dumpRedis(t *testing.T, queue, prefix string) string {
	t.Helper()
	ctx := context.Background()
	rdb := redistest.Client(t)
	var out strings.Builder
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		if othersKey(key, queue, prefix) {
			continue
		}
		typ, err := rdb.Type(ctx, key).Result()
		require.NoError(t, err)
		var val any
		switch typ {
		case "string":
			val, err = rdb.Get(ctx, key).Result()
		case "hash":
			val, err = rdb.HGetAll(ctx, key).Result()
		case "list":
			val, err = rdb.LRange(ctx, key, 0, -1).Result()
		case "set":
			val, err = rdb.SMembers(ctx, key).Result()
		case "zset":
			val, err = rdb.ZRangeWithScores(ctx, key, 0, -1).Result()
		case "stream":
			val, err = rdb.XRange(ctx, key, "-", "+").Result()
		case "none":
			continue // expired since the scan saw it
		default:
			t.Fatalf("key %q has type %q, which the dump does not read", key, typ)
		}
		if err == redis.Nil {
			continue
		}
		require.NoError(t, err, "read %s %q", typ, key)
		fmt.Fprintf(&out, "%s %s = %v\n", typ, key, val)
	}
	require.NoError(t, iter.Err())
	return out.String()
}

// othersKey reports whether key is in a namespace that another test or a benchmark run owns on the
// shared Redis (its asynq queues, its key prefix): not this test's to read, and perhaps large.
// Every other key is this test's or llmq's shared state, and is dumped.
func othersKey(key, queue, prefix string) bool {
	for _, ns := range []string{"asynq:{llmq-test-", "asynq:{llmq-bench-", "asynq:{bench-", "llmq:test:"} {
		if strings.HasPrefix(key, ns) {
			return !strings.HasPrefix(key, "asynq:{"+queue) && !strings.HasPrefix(key, prefix)
		}
	}
	return false
}

// serveMetrics returns what /metrics serves for reg.
func serveMetrics(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	return rec.Body.String()
}
