package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/worker"
)

// The short chaos run (the bench module's chaos scenario is the long one): jobs against a
// slow, rate-limited simulator while one of two workers dies mid-run and Redis is flushed. Every
// job must succeed with exactly one stored result, and no job may be called after it succeeded.

// chaosCalls wraps the simulator and notes when each request of a job arrived. The job is named
// by a marker in its prompt: the simulator sees only the request body.
type chaosCalls struct {
	next http.Handler
	re   *regexp.Regexp

	mu       sync.Mutex
	arrivals map[int][]time.Time
}

func chaosPrompt(i int) string { return "chaos-short-job-" + strconv.Itoa(i) }

func newChaosCalls(next http.Handler) *chaosCalls {
	return &chaosCalls{next: next, re: regexp.MustCompile(`chaos-short-job-([0-9]+)\b`), arrivals: map[int][]time.Time{}}
}

func (c *chaosCalls) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if m := c.re.FindSubmatch(body); m != nil {
		i, _ := strconv.Atoi(string(m[1]))
		c.mu.Lock()
		c.arrivals[i] = append(c.arrivals[i], at)
		c.mu.Unlock()
	}
	c.next.ServeHTTP(w, r)
}

func (c *chaosCalls) of(i int) []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.arrivals[i]...)
}

func (c *chaosCalls) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.arrivals {
		n += len(a)
	}
	return n
}

// severableDialer gives a worker's provider client connections that can all be cut at once, the
// way the provider sees a worker process die mid-call.
type severableDialer struct {
	mu      sync.Mutex
	severed bool
	conns   []net.Conn
}

func (d *severableDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.severed {
		return nil, errors.New("the worker is gone")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *severableDialer) sever() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.severed = true
	for _, c := range d.conns {
		_ = c.Close()
	}
}

// chaosStack is the API and the stores of a chaos test; workers are started separately.
type chaosStack struct {
	cfg      *config.Config
	yaml     string // the config file's text, with the provider key in env SIM_KEY
	dbURL    string
	redisURL string
	apiURL   string
	pool     *pgxpool.Pool
	calls    *chaosCalls
	sim      *llmsim.Server
	ctx      context.Context
	// orphanGrace is the sweeper's OrphanGrace in the workers startWorker runs (0: the
	// default): the tests that SIGKILL a worker process set rescueOrphanGrace.
	orphanGrace time.Duration
}

// rescueOrphanGrace is the OrphanGrace of the workers that rescue a SIGKILLed worker process's
// jobs: above asynq's 5 s server heartbeat (how old a live server's list of running tasks can
// be), as the default (15 s) is, but by less. A running job's grace starts when its attempt
// lease (15 s) ends, so its rescue comes 23 s after its attempt began instead of 30 s.
const rescueOrphanGrace = 8 * time.Second

func newChaosStack(t *testing.T) *chaosStack {
	t.Helper()
	// 10 requests per second against 200 ms answers: 40 jobs take about 3 s, long enough to
	// fault in the middle. The simulator's bucket holds twice the limiter's burst: a flush makes
	// the shared limiter forget what it granted, and its fresh burst would otherwise meet an
	// empty bucket with a wave of 429s whose retries spend the retry budget (10 + 10% of first
	// attempts per minute), leaving the last retries to wait up to a minute for it. The breaker
	// is out of the way for the same reason: the calls cut by a dying worker are network errors,
	// which open it for its 30 s cooldown. Both are designed behaviour with tests of their own;
	// this test is about losing and duplicating nothing.
	return newChaosStackSim(t, llmsim.Config{Capacity: 20, RefillPerSecond: 10, Latency: 200 * time.Millisecond})
}

// newChaosStackSim is a chaos stack whose provider is a simulator configured by simCfg.
func newChaosStackSim(t *testing.T, simCfg llmsim.Config) *chaosStack {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &chaosStack{ctx: ctx, redisURL: redistest.Server(t), dbURL: pgtest.URL(t)}
	s.sim = llmsim.New(simCfg)
	s.calls = newChaosCalls(s.sim)
	simSrv := httptest.NewServer(s.calls)
	t.Cleanup(simSrv.Close)
	s.yaml = fmt.Sprintf(`
database_url: %s
redis_url: %s
api: { allow_anonymous: true }
worker: { concurrency: 50, queue: llmq-chaos-%s, sweep_interval: 100ms, metrics_listen: "off" }
credentials:
  - { name: default, provider: anthropic, base_url: %s, api_key_env: SIM_KEY, limits: { requests_per_second: 10, burst: 10 } }
retry: { max_attempts: 10, base_delay: 10ms, max_delay: 200ms }
breaker: { threshold: 1000 }
`, s.dbURL, s.redisURL, redistest.Rand(), simSrv.URL)
	var err error
	s.cfg, err = config.Parse([]byte(s.yaml), func(k string) string {
		if k == "SIM_KEY" {
			return simKey
		}
		return ""
	})
	require.NoError(t, err)
	s.pool, err = openPool(ctx, s.dbURL)
	require.NoError(t, err)
	t.Cleanup(s.pool.Close)
	apiSrv, closeAPI, err := api.FromConfig(s.cfg, s.pool, prometheus.NewRegistry(), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = closeAPI() })
	hs := httptest.NewServer(apiSrv)
	t.Cleanup(hs.Close)
	s.apiURL = hs.URL
	return s
}

// startWorker runs an in-process worker with the given concurrency (0: the config's) whose
// provider client is hc (nil: the default), and returns a function that cancels its context
// (asynq then hands back the tasks its handlers have not finished).
func (s *chaosStack) startWorker(t *testing.T, hc *http.Client, concurrency int) (stop func()) {
	t.Helper()
	pool, err := openPool(s.ctx, s.dbURL)
	require.NoError(t, err)
	cfg := *s.cfg
	if concurrency > 0 {
		cfg.Worker.Concurrency = concurrency
	}
	w, err := worker.New(s.ctx, &cfg, pool, worker.Options{Registerer: prometheus.NewRegistry(), HTTPClient: hc,
		OrphanGrace: s.orphanGrace})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		pool.Close()
	})
	return cancel
}

// submitAll submits n jobs at once to the stack's API, each with its own Idempotency-Key and
// marker, and returns their IDs.
func (s *chaosStack) submitAll(t *testing.T, n int) []string {
	t.Helper()
	return s.submitAllTo(t, s.apiURL, n)
}

// submitTimeout bounds each of submitAllTo's submits.
const submitTimeout = 30 * time.Second

// submitAllTo is submitAll through the API at apiURL.
func (s *chaosStack) submitAllTo(t *testing.T, apiURL string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			body := fmt.Sprintf(`{"request":{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":%q}]},"max_attempts":20}`,
				chaosPrompt(i))
			// A submit answers in milliseconds: one that hangs fails the test, not the suite.
			rctx, cancel := context.WithTimeout(s.ctx, submitTimeout)
			defer cancel()
			ids[i], errs[i] = submitKeyed(rctx, apiURL, fmt.Sprintf("chaos-%d", i), body)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("job %d: %w", i, errs[i])
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return ids
}

// submitKeyed submits body under key as a client that wants its job would: a 429 or 503 (the
// server too busy for it now: a loaded machine holds submits past the keyed-submit gate's wait)
// is sent again under the same key after its Retry-After, until ctx ends. It returns the job's ID.
func submitKeyed(ctx context.Context, apiURL, key, body string) (string, error) {
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/v1/jobs", strings.NewReader(body))
		if err != nil {
			return "", err
		}
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusAccepted, http.StatusOK:
			m := regexp.MustCompile(`"id":"([^"]+)"`).FindSubmatch(raw)
			if m == nil {
				return "", fmt.Errorf("no id in %s", raw)
			}
			return string(m[1]), nil
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			wait := time.Second
			if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
				wait = time.Duration(secs) * time.Second
			}
			select {
			case <-ctx.Done():
				return "", fmt.Errorf("%d %s, then %w", resp.StatusCode, raw, ctx.Err())
			case <-time.After(wait):
			}
		default:
			return "", fmt.Errorf("%d %s", resp.StatusCode, raw)
		}
	}
}

// unfinished counts the jobs not terminal.
func (s *chaosStack) unfinished(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, s.pool.QueryRow(s.ctx, `SELECT count(*) FROM jobs WHERE status IN ('queued', 'running', 'retrying')`).Scan(&n))
	return n
}

// flush empties the private Redis, which must hold something (the queue, the limiter).
func (s *chaosStack) flush(t *testing.T) {
	t.Helper()
	opt, err := redis.ParseURL(s.redisURL)
	require.NoError(t, err)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	require.Positive(t, rdb.DBSize(s.ctx).Val(), "nothing to lose")
	require.NoError(t, rdb.FlushAll(s.ctx).Err())
}

// waitAllTerminal polls until no job is unfinished or the deadline passes, and then describes
// the jobs still unfinished (with the state of their asynq task) in the failure.
func (s *chaosStack) waitAllTerminal(t *testing.T, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for s.unfinished(t) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("jobs not terminal %s after the faults:\n%s", within, s.describeUnfinished(t))
		}
		time.Sleep(50 * time.Millisecond) // polling with a deadline
	}
}

func (s *chaosStack) describeUnfinished(t *testing.T) string {
	t.Helper()
	opt, err := asynq.ParseRedisURI(s.redisURL)
	require.NoError(t, err)
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	rows, err := s.pool.Query(s.ctx, `SELECT id::text, status, attempts, updated_at, coalesce(last_error::text, '') FROM jobs
WHERE status IN ('queued', 'running', 'retrying') ORDER BY id`)
	require.NoError(t, err)
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var id, status, lastErr string
		var attempts int
		var updated time.Time
		require.NoError(t, rows.Scan(&id, &status, &attempts, &updated, &lastErr))
		task := "missing"
		if info, err := insp.GetTaskInfo(s.cfg.Worker.Queue, id); err == nil {
			task = info.State.String()
		}
		fmt.Fprintf(&b, "  %s: %s, %d attempts, row unchanged for %s, asynq task %s, last error %s\n", id, status, attempts,
			time.Since(updated).Round(time.Millisecond), task, lastErr)
	}
	return b.String()
}

// requireExactlyOnce checks the end state: every job succeeded with exactly one stored result,
// one row per idempotency key, and the provider saw no request of a job after it succeeded.
func (s *chaosStack) requireExactlyOnce(t *testing.T, ids []string) {
	t.Helper()
	rows, err := s.pool.Query(s.ctx, `SELECT id::text, idempotency_key, status, result IS NOT NULL, finished_at,
	request->'messages'->0->>'content' FROM jobs`)
	require.NoError(t, err)
	type row struct {
		id, status, prompt string
		result             bool
		finished           *time.Time
	}
	byKey := map[string][]row{}
	for rows.Next() {
		var r row
		var key string
		require.NoError(t, rows.Scan(&r.id, &key, &r.status, &r.result, &r.finished, &r.prompt))
		byKey[key] = append(byKey[key], r)
	}
	rows.Close()
	require.NoError(t, rows.Err())
	require.Len(t, byKey, len(ids), "one row per submitted job, nothing else")
	for i, id := range ids {
		got := byKey[fmt.Sprintf("chaos-%d", i)]
		require.Len(t, got, 1, "job %d: exactly one row", i)
		r := got[0]
		require.Equal(t, id, r.id, "job %d: the row is the job the API accepted", i)
		require.Equal(t, chaosPrompt(i), r.prompt)
		require.Equal(t, "succeeded", r.status, "job %d", i)
		require.True(t, r.result, "job %d: succeeded with a stored result", i)
		require.NotNil(t, r.finished)
		calls := s.calls.of(i)
		require.NotEmpty(t, calls, "job %d: the provider was called", i)
		for _, at := range calls {
			if at.After(*r.finished) {
				t.Fatalf("job %d (%s) called at %s, %s after it succeeded (finished_at %s)\n%s", i, r.id,
					at.Format("15:04:05.000000"), at.Sub(*r.finished), r.finished.Format("15:04:05.000000"), s.history(t, r.id, calls))
			}
		}
	}
}

// history renders a job's transitions, recorded attempts and provider calls, for a failure.
func (s *chaosStack) history(t *testing.T, id string, calls []time.Time) string {
	t.Helper()
	var b strings.Builder
	rows, err := s.pool.Query(s.ctx, `SELECT seq, type, payload::text, created_at FROM job_events WHERE job_id = $1 ORDER BY seq`, id)
	require.NoError(t, err)
	for rows.Next() {
		var seq int
		var typ, payload string
		var at time.Time
		require.NoError(t, rows.Scan(&seq, &typ, &payload, &at))
		fmt.Fprintf(&b, "  event %d %s %s at %s (transaction start)\n", seq, typ, payload, at.Format("15:04:05.000000"))
	}
	rows.Close()
	rows, err = s.pool.Query(s.ctx, `SELECT attempt, started_at, latency_ms, coalesce(status_code, 0), class FROM job_attempts
WHERE job_id = $1 ORDER BY attempt`, id)
	require.NoError(t, err)
	for rows.Next() {
		var n, status int
		var started time.Time
		var latency float64
		var class string
		require.NoError(t, rows.Scan(&n, &started, &latency, &status, &class))
		fmt.Fprintf(&b, "  attempt %d started %s, %.1f ms, status %d, %s\n", n, started.Format("15:04:05.000000"), latency, status, class)
	}
	rows.Close()
	for _, at := range calls {
		fmt.Fprintf(&b, "  provider call arrived %s\n", at.Format("15:04:05.000000"))
	}
	return b.String()
}

// TestChaos_WorkerDiesAndRedisFlushed: 40 jobs, two in-process workers; one dies mid-run (every
// provider connection it has open is cut, so the provider sees its calls end half-way, and its
// context is canceled), then Redis is flushed. Every job succeeds once, and nothing is called
// after it succeeded. Worker B runs 3 jobs at a time: each call it loses is retried, and the
// retry budget (10 + 10% of first attempts per minute, not configurable) must not be what the
// test waits for. A real SIGKILL is TestChaos_SIGKILLedWorkerProcess.
func TestChaos_WorkerDiesAndRedisFlushed(t *testing.T) {
	t.Parallel()
	// Before the attempt lease (migration 008), the sweeper could re-enqueue a job whose live
	// delivery was still in its inline wait after the flush, and the provider was sometimes
	// called twice (3-8 in 20 runs under load); requireExactlyOnce catches that.
	s := newChaosStack(t)
	s.startWorker(t, nil, 0)
	dialer := &severableDialer{}
	tr := &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	stopB := s.startWorker(t, &http.Client{Transport: tr}, 3)

	const n = 40
	start := time.Now()
	ids := s.submitAll(t, n)

	// The faults' timing is the experiment: at 0.8 s worker B dies, at 1.5 s Redis loses
	// everything. Both must hit a run in progress.
	time.Sleep(time.Until(start.Add(800 * time.Millisecond)))
	require.Positive(t, s.unfinished(t), "worker B must die while jobs are still running")
	dialer.sever()
	stopB()
	time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
	require.Positive(t, s.unfinished(t), "Redis must be flushed while jobs are still unfinished")
	s.flush(t)

	s.waitAllTerminal(t, 15*time.Second)
	s.requireExactlyOnce(t, ids)
	require.GreaterOrEqual(t, s.calls.total(), n)
}

// TestChaos_SIGKILLedWorkerProcess is the same run with a real worker process killed by SIGKILL
// (built with go build), then another worker started, with and without a Redis flush after the
// kill. The jobs the dead process left running wait for their attempt lease (15 s); without the
// flush, its tasks stay active in asynq (which would recover them only after 1-2 min), and the
// sweeper rescues them once they have looked orphaned for its OrphanGrace (rescueOrphanGrace
// here, 15 s by default). Every job must end within 60 s of the kill (the chaos target;
// LLMQ_CHAOS_SIGKILL_WITHIN overrides it), its provider called by one delivery at a time and
// never after it succeeded.
func TestChaos_SIGKILLedWorkerProcess(t *testing.T) {
	t.Parallel()
	within := 60 * time.Second
	if v := os.Getenv("LLMQ_CHAOS_SIGKILL_WITHIN"); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err)
		within = d
	}
	bin := buildWorker(t)
	for _, flush := range []bool{true, false} {
		t.Run(fmt.Sprintf("flush=%v", flush), func(t *testing.T) {
			t.Parallel()
			sigkillRun(t, bin, flush, within)
		})
	}
}

func sigkillRun(t *testing.T, bin string, flush bool, within time.Duration) {
	s := newChaosStack(t)
	s.orphanGrace = rescueOrphanGrace
	proc := s.startWorkerProcess(t, bin)

	const n = 40
	ids := s.submitAll(t, n)
	s.waitMidRun(t)
	require.NoError(t, proc.Signal(syscall.SIGKILL))
	require.Positive(t, s.unfinished(t))
	if flush {
		s.flush(t)
	}
	s.startWorker(t, nil, 0)

	s.waitAllTerminal(t, within)
	s.requireExactlyOnce(t, ids)
}

// buildWorker returns the path of cmd/worker's program (binDir).
func buildWorker(t *testing.T) string {
	t.Helper()
	return buildCmd(t, "worker")
}

// buildCmd returns the path of cmd/<name>'s program, one of cmdBins (binDir).
func buildCmd(t *testing.T, name string) string {
	t.Helper()
	require.Contains(t, cmdBins, name)
	return filepath.Join(binDir(t), name)
}

// startWorkerProcess runs the worker binary bin on the stack's config as a process of its own,
// logging to worker.log in a temporary directory; it is killed, if still running, when the test
// ends. The caller may SIGKILL it through the returned process.
func (s *chaosStack) startWorkerProcess(t *testing.T, bin string) *os.Process {
	t.Helper()
	return s.startProcess(t, bin)
}

// startProcess runs bin with args, then --config and the stack's config, as startWorkerProcess
// does.
func (s *chaosStack) startProcess(t *testing.T, bin string, args ...string) *os.Process {
	t.Helper()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "llmq.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(s.yaml), 0o600))
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LLMQ_") {
			env = append(env, kv)
		}
	}
	logf, err := os.Create(filepath.Join(dir, "worker.log"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = logf.Close() })
	proc := exec.Command(bin, append(args, "--config", cfgPath)...)
	proc.Env = append(env, "SIM_KEY="+simKey)
	proc.Stdout, proc.Stderr = logf, logf
	proc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, proc.Start())
	exited := make(chan error, 1)
	go func() { exited <- proc.Wait() }()
	t.Cleanup(func() { _ = proc.Process.Kill(); <-exited })
	return proc.Process
}

// TestChaos_SIGKILLedServeProcess: the jobs submitted to an `llmq serve` process run their first
// delivery in it with no asynq task (dispatch.Handoff). SIGKILLed mid-run, it leaves jobs that
// no task names anywhere, waiting for their limiter slot or running. The sweeper enqueues them
// (after its grace for fresh jobs, or once their attempt's lease ended) and another worker
// finishes each, its provider called by one delivery at a time and never after it succeeded,
// within the chaos target.
func TestChaos_SIGKILLedServeProcess(t *testing.T) {
	t.Parallel()
	bin := buildCmd(t, "llmq")
	s := newChaosStack(t)
	addr := freeLocalAddr(t)
	proc := s.startProcess(t, bin, "serve", "--listen", addr)
	apiURL := "http://" + addr
	hc := &http.Client{Timeout: time.Second}
	require.Eventually(t, func() bool {
		resp, err := hc.Get(apiURL + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "llmq serve did not answer /healthz")

	const n = 40
	ids := s.submitAllTo(t, apiURL, n)
	s.waitMidRun(t)
	require.NoError(t, proc.Signal(syscall.SIGKILL))
	require.Positive(t, s.taskless(t), "the serve process ran jobs without a task (else this test is the worker's)")
	s.startWorker(t, nil, 0)

	s.waitAllTerminal(t, 60*time.Second)
	s.requireExactlyOnce(t, ids)
}

// waitMidRun waits until the provider has had 10 calls: mid-run for 40 jobs, with more to send.
func (s *chaosStack) waitMidRun(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool { return s.calls.total() >= 10 }, 20*time.Second, 10*time.Millisecond,
		"the process sent no requests")
}

// taskless counts the unfinished jobs that have no task on the main queue (the chaos jobs are
// normal ones).
func (s *chaosStack) taskless(t *testing.T) int {
	t.Helper()
	rows, err := s.pool.Query(s.ctx, `SELECT id::text FROM jobs WHERE status IN ('queued', 'running', 'retrying')`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	opt, err := dispatch.RedisConnOpt(s.redisURL)
	require.NoError(t, err)
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	n := 0
	for _, id := range ids {
		_, err := insp.GetTaskInfo(s.cfg.Worker.Queue, id)
		if errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound) {
			n++
			continue
		}
		require.NoError(t, err)
	}
	return n
}

// freeLocalAddr returns a 127.0.0.1 address with a port free a moment ago.
func freeLocalAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
