// Package e2e_test drives the whole system through real HTTP: the API, a worker, the simulator,
// Postgres and Redis, each test on its own database, queue and simulator.
package e2e_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/worker"
	"github.com/llmq/llmq/migrations"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// These tests mostly wait (for processes, attempt leases, the sweeper), so running only as
	// many at once as there are cores (go test's default) made this package the suite's longest
	// by a minute; an explicit -parallel wins.
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", strconv.Itoa(max(4, runtime.GOMAXPROCS(0)))); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m,
		// pgxpool's background health check and net/http keep-alives end after the test's Close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.Cleanup(func(code int) {
			removeBins()
			os.Exit(code)
		}),
	)
}

const simKey = "sk-test-e2e-key"

// streamKey signs the API's events_url.
const streamKey = "e2e-stream-url-key-0123456789abcdef"

type testBundle struct {
	cfg    *config.Config
	sim    *llmsim.Server
	backup *llmsim.Server // the provider of credential "backup" (anthropic), for failover
	simURL string
	apiURL string
	dbURL  string
	// redisURL is the Redis (or Redis Cluster) of this test, and prefix the key prefix of its
	// limiter, breaker and alerter there.
	redisURL string
	prefix   string
	ctx      context.Context
	pg       *pgtest.Proxy // with setupOpts.pgProxy: the proxy every process reaches Postgres through
	// workerMetrics is the registry of the worker startWorker started last.
	workerMetrics *prometheus.Registry
	// workerShutdown is setupOpts.workerShutdown, for every worker startWorker starts.
	workerShutdown time.Duration
	// leaseRenewal is setupOpts.leaseRenewal, for every worker startWorker starts.
	leaseRenewal time.Duration
}

type setupOpts struct {
	sim        llmsim.Config
	redisURL   string // default: the shared test Redis; a redis-cluster:// URL runs on a cluster
	noWorker   bool   // start the worker later with startWorker
	webhookURL string // alerts.webhook_url
	limits     string // YAML limits of credential "default", e.g. "{requests_per_second: 10, burst: 20}"
	extra      string // more YAML fields of credential "default", e.g. "pause_probe_interval: 1s"
	backup     string // more YAML fields of credential "backup", as extra
	top        string // more top-level YAML, e.g. "breaker: {threshold: 2, cooldown: 1s}"
	worker     string // more fields of the worker block, e.g. "token_minute: 1s"
	// concurrency is worker.concurrency, the worker's delivery slots. Default 50.
	concurrency int
	// pgProxy puts a proxy that the test can cut off (testBundle.pg) between every llmq
	// process and Postgres.
	pgProxy bool
	// keepAlive is the API's event-stream keep-alive interval (api.Options.KeepAlive), at which
	// an idle stream checks its token again. Default 15s.
	keepAlive time.Duration
	// tenantTTL is how long the API reuses a tenant lookup's answer (api.Options.TenantTTL),
	// which a revocation takes to reach it. Default 2s.
	tenantTTL time.Duration
	// storeWait is how long the API lets a request wait for a pool connection or for a place
	// among its tenant's keyed submits and cancels (api.Options.StoreWait) before refusing it.
	// Default 5s.
	storeWait time.Duration
	// workerShutdown is how long a worker stopping at the test's end lets its deliveries finish
	// (worker.Options.ShutdownTimeout): a test that leaves a long call running shortens it
	// rather than wait for the call. Default 10s.
	workerShutdown time.Duration
	// leaseRenewal is how often a worker's running attempt renews its job's lease
	// (worker.Options.LeaseRenewInterval), a renewal that finds the job canceled stopping the
	// call too: a test that must see the cancel itself stop the call sets it beyond its
	// deadline. Default a third of jobs.AttemptLease.
	leaseRenewal time.Duration
}

func setup(t *testing.T, o setupOpts) *testBundle {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sim := llmsim.New(o.sim)
	simSrv := httptest.NewServer(sim)
	t.Cleanup(simSrv.Close)
	backup := llmsim.New(llmsim.Config{})
	backupSrv := httptest.NewServer(backup)
	t.Cleanup(backupSrv.Close)
	redisURL := o.redisURL
	if redisURL == "" {
		redisURL = redistest.URL()
	}
	queue := redistest.Queue(t, redisURL) // removed after the processes below stopped
	dbURL := pgtest.URL(t)
	var proxy *pgtest.Proxy
	if o.pgProxy {
		proxy, dbURL = pgtest.NewProxy(t, dbURL)
	}
	yaml := fmt.Sprintf(`
database_url: %s
redis_url: %s
api: { allow_anonymous: true, max_body_bytes: 65536, stream_secret_env: STREAM_KEY }
worker: { concurrency: %d, queue: %s, sweep_interval: 100ms, metrics_listen: "off"%s }
credentials:
  - { name: default, provider: anthropic, base_url: %s, api_key_env: SIM_KEY%s }
  - { name: oai, provider: openai, base_url: %s, api_key_env: SIM_KEY }
  - { name: backup, provider: anthropic, base_url: %s, api_key_env: SIM_KEY%s }
retry: { max_attempts: 5, base_delay: 10ms, max_delay: 50ms }
alerts: { webhook_url: %q }
%s
`, dbURL, redisURL, cmp.Or(o.concurrency, 50), queue, extraYAML(o.worker), simSrv.URL, limitsYAML(o.limits)+extraYAML(o.extra), simSrv.URL, backupSrv.URL,
		extraYAML(o.backup), o.webhookURL, o.top)
	cfg, err := config.Parse([]byte(yaml), func(k string) string {
		switch k {
		case "SIM_KEY":
			return simKey
		case "STREAM_KEY":
			return streamKey
		}
		return ""
	})
	require.NoError(t, err)

	b := &testBundle{cfg: cfg, sim: sim, backup: backup, simURL: simSrv.URL, dbURL: dbURL, redisURL: redisURL,
		prefix: redistest.PrefixOn(t, redisURL), ctx: ctx, pg: proxy, workerShutdown: o.workerShutdown,
		leaseRenewal: o.leaseRenewal}
	pool, err := openPool(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	apiSrv, closeAPI, err := api.FromConfigWith(cfg, pool, prometheus.NewRegistry(), nil, api.Options{KeepAlive: o.keepAlive, TenantTTL: o.tenantTTL,
		StoreWait: o.storeWait})
	require.NoError(t, err)
	t.Cleanup(func() { _ = closeAPI() })
	// Every answer of every end-to-end test must be one that api/openapi.yaml describes.
	hs := httptest.NewServer(openapitest.Handler(t, apiSrv))
	t.Cleanup(hs.Close)
	b.apiURL = hs.URL
	if !o.noWorker {
		b.startWorker(t)
	}
	return b
}

// startWorker runs a worker in-process until the test ends.
func (b *testBundle) startWorker(t *testing.T) {
	t.Helper()
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	b.workerMetrics = prometheus.NewRegistry()
	w, err := worker.New(b.ctx, b.cfg, pool, worker.Options{Registerer: b.workerMetrics, RedisPrefix: b.prefix,
		ShutdownTimeout: b.workerShutdown, LeaseRenewInterval: b.leaseRenewal})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		pool.Close()
	})
}

// inspector returns an asynq Inspector on the test's Redis, closed when the test ends.
func (b *testBundle) inspector(t *testing.T) *asynq.Inspector {
	t.Helper()
	opt, err := dispatch.RedisConnOpt(b.redisURL)
	require.NoError(t, err)
	insp := asynq.NewInspector(opt)
	t.Cleanup(func() { _ = insp.Close() })
	return insp
}

// deferral says where job id's delivery stands, as an operator inspecting asynq sees it: active
// when a worker runs its task or its due task (a low job's deferral, on the main queue), else why
// it waits (its task's last error, or its due task's last error or the reason in its body); ok
// is false when neither is found.
func (b *testBundle) deferral(insp *asynq.Inspector, id string) (active bool, why string, ok bool) {
	q := dispatch.NewQueues(b.cfg.Worker.Queue)
	if info, err := insp.GetTaskInfo(q.For(""), id); err == nil {
		return info.State == asynq.TaskStateActive, info.LastErr, true
	}
	info, err := insp.GetTaskInfo(q.Due(), id+":due")
	if err != nil {
		return false, "", false
	}
	var body struct {
		Deferred string `json:"deferred"`
	}
	_ = json.Unmarshal(info.Payload, &body)
	return info.State == asynq.TaskStateActive, info.LastErr + " " + body.Deferred, true
}

// requestTimeout bounds each request a test makes to the API and the reading of its answer: an
// answer that never comes, or one expected whole that turns out to be an endless stream, fails
// the test instead of hanging the package until go test's -timeout.
const requestTimeout = 20 * time.Second

type response struct {
	status int
	header http.Header
	body   map[string]any
}

func (b *testBundle) do(t *testing.T, method, path string, body string, header map[string]string) response {
	t.Helper()
	out, err := b.tryDo(method, path, body, header)
	require.NoError(t, err)
	return out
}

// tryDo is do for a goroutine other than the test's, which must not end the test (FailNow): it
// returns the failure instead.
func (b *testBundle) tryDo(method, path string, body string, header map[string]string) (response, error) {
	var rd io.Reader
	if body != "" {
		rd = bytes.NewBufferString(body)
	}
	ctx, cancel := context.WithTimeout(b.ctx, requestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, b.apiURL+path, rd)
	if err != nil {
		return response{}, err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	out := response{status: resp.StatusCode, header: resp.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.body); err != nil {
			return out, fmt.Errorf("body %s: %w", raw, err)
		}
	}
	return out, nil
}

// submit posts a job and requires 202; it returns the job ID.
func (b *testBundle) submit(t *testing.T, body string) string {
	t.Helper()
	r := b.do(t, http.MethodPost, "/v1/jobs", body, nil)
	require.Equal(t, http.StatusAccepted, r.status, "body: %v", r.body)
	return r.body["id"].(string)
}

// submitAs submits body with the headers h (a tenant's, from tenantHeader) and returns the job's
// ID, the submit accepted.
func (b *testBundle) submitAs(t *testing.T, h map[string]string, body string) string {
	t.Helper()
	r := b.do(t, http.MethodPost, "/v1/jobs", body, h)
	require.Equal(t, http.StatusAccepted, r.status, "body %v", r.body)
	return r.body["id"].(string)
}

// waitTerminal polls the job until it is terminal or the deadline passes.
func (b *testBundle) waitTerminal(t *testing.T, id string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // generous: CI machines are shared and slow
	for {
		r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil)
		require.Equal(t, http.StatusOK, r.status)
		switch r.body["status"] {
		case "succeeded", "failed", "dead", "canceled":
			return r.body
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %v after 60s: %v", id, r.body["status"], r.body)
		}
		time.Sleep(20 * time.Millisecond) // polling with a deadline, as a client would
	}
}

// countRows counts rows of a table in this test's database.
func (b *testBundle) countRows(t *testing.T, table string) int {
	t.Helper()
	var n int
	b.queryRow(t, "SELECT count(*) FROM "+table, nil, &n)
	return n
}

// queryRow runs one query on this test's database and scans its row into dest.
func (b *testBundle) queryRow(t *testing.T, sql string, args []any, dest ...any) {
	t.Helper()
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, pool.QueryRow(b.ctx, sql, args...).Scan(dest...))
}

func limitsYAML(l string) string {
	if l == "" {
		return ""
	}
	return ", limits: " + l
}

func extraYAML(e string) string {
	if e == "" {
		return ""
	}
	return ", " + e
}

func anthropicBody(text string) string {
	return fmt.Sprintf(`{"request":{"model":"claude-test","max_tokens":64,"messages":[{"role":"user","content":%q}]}}`, text)
}

// testPoolConns caps each pool an e2e test opens. The package's tests run in parallel, beside
// other packages' tests, on one Postgres (max_connections 100 on our machines); at the
// production default of 16 per pool, an API and two workers per test ran it out.
const testPoolConns = 6

// openPool is migrations.Open with the pool capped at testPoolConns.
func openPool(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	return migrations.Open(ctx, dbURL+sep+"pool_max_conns="+strconv.Itoa(testPoolConns))
}
