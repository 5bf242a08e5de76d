package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
)

// simKeyEnv is the environment variable through which the children get the simulator's key.
const simKeyEnv = "LLMQ_BENCH_SIM_KEY"

// Polling of job status: every pollInterval, the outstanding jobs are fetched with at most
// pollConcurrency requests in flight, so 100 jobs do not cost 5,000 requests a second on a
// small machine. A result is seen at most one round after it is stored.
const (
	pollInterval    = 20 * time.Millisecond
	pollConcurrency = 8
)

// llmqRow returns the row that runs the herd through the whole system: a fresh database, a
// fresh queue, the api binary and -workers worker binaries, jobs submitted and polled over
// HTTP. With configured, the credential carries the simulator's limits; without, llmq must
// learn them.
func llmqRow(configured bool) func(context.Context, *rowEnv) ([]outcome, error) {
	return func(ctx context.Context, e *rowEnv) ([]outcome, error) {
		var s llmqSetup
		if configured {
			s.limits = &config.Limits{RequestsPerSecond: e.rate, Burst: int(e.capacity)}
		}
		return runLLMQ(ctx, e, s)
	}
}

// llmqSetup is what an llmq row sets in the config beyond its stores, queue and simulator.
type llmqSetup struct {
	limits  *config.Limits  // the credential's limits; nil: learned from the provider
	breaker *config.Breaker // the breaker block; nil: llmq's defaults
	// tokenMinute is worker.token_minute (the provider's token "minute"); 0: llmq's default.
	tokenMinute time.Duration
}

// runLLMQ runs e.n jobs through the whole system: a fresh database, a fresh queue, the api
// binary and e.workers worker binaries configured by s, jobs submitted at once and polled over
// HTTP. Everything it created is removed when it returns (the config and logs are kept with
// -keep-logs, or when it fails).
func runLLMQ(ctx context.Context, e *rowEnv, s llmqSetup) (outs []outcome, err error) {
	suffix := randHex(6)
	dir, err := os.MkdirTemp("", "llmq-bench-")
	if err != nil {
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	defer func() {
		if e.keepLogs || (err != nil && ctx.Err() == nil) {
			e.logf("config and logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	dbURL, dropDB, err := createDatabase(ctx, e.dbURL, "llmq_bench_"+suffix)
	if err != nil {
		return nil, err
	}
	defer dropDB()
	queue := "llmq-bench-" + suffix

	cfgPath := filepath.Join(dir, "llmq.yaml")
	cfg, err := writeConfig(cfgPath, dbURL, e.redisURL, queue, e.simURL, e.apiKey, s)
	if err != nil {
		return nil, err
	}
	defer cleanLLMQRedis(e.redisURL, queue, cfg.Credentials[0].LimiterID())
	st, err := startStack(ctx, stackConfig{
		bin: e.bin, configPath: cfgPath, workers: e.workers, logDir: dir,
		env: []string{simKeyEnv + "=" + e.apiKey}, redisURL: e.redisURL, queue: queue,
	})
	if err != nil {
		return nil, err
	}
	defer st.stop()
	e.logf("api at %s and %d workers ready", st.apiURL, e.workers)

	outs, err = herdOverHTTP(ctx, e, st)
	if err != nil {
		return nil, err
	}
	if err := st.stop(); err != nil {
		e.logf("stopping the stack: %v", err)
	}
	return outs, nil
}

// writeConfig writes the llmq config of one row and returns it as the programs will load it.
// The simulator's key is referenced through simKeyEnv; the file is validated with the real
// loader before any process starts.
func writeConfig(path, dbURL, redisURL, queue, simURL, apiKey string, s llmqSetup) (*config.Config, error) {
	limitLine, breakerLine, workerExtra := "", "", ""
	if l := s.limits; l != nil {
		var toks string
		for _, f := range []struct {
			key string
			v   float64
		}{{"input_tokens_per_minute", l.InputTokensPerMinute}, {"output_tokens_per_minute", l.OutputTokensPerMinute}, {"tokens_per_minute", l.TokensPerMinute}} {
			if f.v > 0 {
				toks += fmt.Sprintf(", %s: %g", f.key, f.v)
			}
		}
		limitLine = fmt.Sprintf("\n    limits: { requests_per_second: %g, burst: %d%s }", l.RequestsPerSecond, l.Burst, toks)
	}
	if s.tokenMinute > 0 {
		workerExtra = ", token_minute: " + s.tokenMinute.String()
	}
	if s.breaker != nil {
		maxCooldown := ""
		if s.breaker.MaxCooldown > 0 {
			maxCooldown = fmt.Sprintf(", max_cooldown: %s", s.breaker.MaxCooldown)
		}
		breakerLine = fmt.Sprintf("breaker: { threshold: %d, cooldown: %s%s, cold_start_cap: %t }\n",
			s.breaker.Threshold, s.breaker.Cooldown, maxCooldown, s.breaker.ColdStartCap)
	}
	yaml := fmt.Sprintf(`# Written by the bench for one row; removed afterwards.
database_url: %q
redis_url: %q
api: { allow_anonymous: true }
worker: { queue: %q, metrics_listen: "off"%s }
%scredentials:
  - name: default
    provider: anthropic
    base_url: %q
    api_key_env: %s%s
`, dbURL, redisURL, queue, workerExtra, breakerLine, simURL, simKeyEnv, limitLine)
	cfg, err := config.Parse([]byte(yaml), func(k string) string {
		if k == simKeyEnv {
			return apiKey
		}
		return ""
	})
	if err != nil {
		return nil, fmt.Errorf("bench config: %w", err)
	}
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return nil, fmt.Errorf("write config: %w", err)
	}
	return cfg, nil
}

// createDatabase creates database name on the server of adminURL and returns its URL and a
// function that drops it (WITH (FORCE), on its own deadline, so it works after ctx ended). The
// api and worker migrate it at start-up.
func createDatabase(ctx context.Context, adminURL, name string) (string, func(), error) {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("connect to postgres at -database-url: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	u, err := url.Parse(adminURL)
	if err != nil {
		return "", nil, fmt.Errorf("parse -database-url: %w", err)
	}
	u.Path = "/" + name
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, adminURL)
		if err == nil {
			defer c.Close(ctx)
			_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "herd: drop database %s: %v (drop it by hand)\n", name, err)
		}
	}
	return u.String(), drop, nil
}

// cleanLLMQRedis removes a row's asynq queue and the limiter's keys of its credential (the
// limiter tags them with the SHA-256 of the credential's LimiterID; they would also expire on
// their own), on its own deadline.
func cleanLLMQRedis(redisURL, queue, limiterID string) {
	opt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		return
	}
	rdb, ok := opt.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return
	}
	defer rdb.Close()
	cleanQueue(rdb, queue)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sum := sha256.Sum256([]byte(limiterID))
	unlinkMatching(ctx, rdb, "*"+hex.EncodeToString(sum[:])+"*")
}

// herdOverHTTP submits e.n jobs at once to the stack's API and polls them until every one is
// terminal or e.timeout passes from the first submit.
func herdOverHTTP(ctx context.Context, e *rowEnv, st *stack) ([]outcome, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = e.n + pollConcurrency
	tr.MaxIdleConnsPerHost = e.n + pollConcurrency
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	ids := make([]string, e.n)
	submitted := make([]time.Duration, e.n)
	errs := make([]error, e.n)
	fire := make(chan struct{})
	var wg sync.WaitGroup
	var start time.Time
	for i := range e.n {
		wg.Go(func() {
			<-fire
			submitted[i] = time.Since(start)
			ids[i], errs[i] = submitJob(ctx, hc, st.apiURL, i, e.requestBody(i), e.jobMaxAttempts())
		})
	}
	e.started()
	start = time.Now()
	close(fire)
	wg.Wait()
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		return nil, fmt.Errorf("%d of %d submits failed, the first: %w", len(failed), e.n, failed[0])
	}
	e.logf("%d jobs submitted in %s", e.n, seconds(time.Since(start)))

	outs := make([]outcome, e.n)
	statuses := map[string]int{}
	pending := make([]int, e.n)
	for i := range pending {
		pending[i] = i
	}
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for len(pending) > 0 {
		if err := st.exited(); err != nil {
			return nil, err
		}
		got := pollJobs(ctx, hc, st.apiURL, ids, pending)
		now := time.Since(start)
		var still []int
		for k, i := range pending {
			status := got[k]
			if !terminal(status) {
				still = append(still, i)
				continue
			}
			statuses[status]++
			outs[i] = outcome{done: true, ok: status == "succeeded", latency: now - submitted[i], at: now}
			e.progress.record(status == "succeeded")
		}
		pending = still
		if len(pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			if cause := context.Cause(ctx); !errors.Is(cause, context.DeadlineExceeded) {
				return nil, fmt.Errorf("interrupted: %w", cause)
			}
			e.logf("timeout: %d jobs not terminal after %s", len(pending), e.timeout)
			pending = nil
		case <-tick.C:
		}
	}
	if len(statuses) > 1 || (len(statuses) == 1 && statuses["succeeded"] == 0) {
		e.logf("terminal statuses: %v", statuses)
	}
	return outs, nil
}

// submitJob posts job i with the provider request request (deadline 5 min, at most maxAttempts
// attempts) and returns its ID; anything but 202 is an error.
func submitJob(ctx context.Context, hc *http.Client, apiURL string, i int, request []byte, maxAttempts int) (string, error) {
	body := fmt.Appendf(nil, `{"request":%s,"max_attempts":%d,"timeout":"5m"}`, request, maxAttempts)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/v1/jobs", bytes.NewReader(body))
	if err != nil {
		return "", fmt.Errorf("job %d: %w", i, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return "", fmt.Errorf("job %d: %w", i, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("job %d: read answer: %w", i, err)
	}
	if resp.StatusCode != http.StatusAccepted {
		return "", fmt.Errorf("job %d: POST /v1/jobs answered %d: %s", i, resp.StatusCode, bytes.TrimSpace(raw))
	}
	var job struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(raw, &job); err != nil || job.ID == "" {
		return "", fmt.Errorf("job %d: no id in %s", i, bytes.TrimSpace(raw))
	}
	return job.ID, nil
}

// pollJobs fetches the status of ids[pending[k]] for every k, at most pollConcurrency at once.
// A failed fetch yields "" (not terminal; it is asked again next round).
func pollJobs(ctx context.Context, hc *http.Client, apiURL string, ids []string, pending []int) []string {
	out := make([]string, len(pending))
	sem := make(chan struct{}, pollConcurrency)
	var wg sync.WaitGroup
	for k, i := range pending {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[k] = jobStatus(ctx, hc, apiURL, ids[i])
		})
	}
	wg.Wait()
	return out
}

func jobStatus(ctx context.Context, hc *http.Client, apiURL, id string) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, apiURL+"/v1/jobs/"+id, nil)
	if err != nil {
		return ""
	}
	resp, err := hc.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var job struct {
		Status string `json:"status"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&job) != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return ""
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return job.Status
}

func terminal(status string) bool {
	switch status {
	case "succeeded", "failed", "dead", "canceled":
		return true
	}
	return false
}

// stackConfig describes an llmq deployment run as child processes.
type stackConfig struct {
	bin        string   // directory of the api and worker binaries
	configPath string   // the config file every process gets (--config)
	workers    int      // worker processes
	logDir     string   // each process's stderr goes to <logDir>/<name>.log
	env        []string // extra KEY=value for every process
	redisURL   string   // to see the workers register
	queue      string   // the config's worker.queue
}

// stack is a running api and its workers. Its processes are stopped by stop, by the parent's
// death (Linux: Pdeathsig) and never outlive a returned error of startStack.
type stack struct {
	apiURL string
	procs  []*proc
	once   sync.Once
	err    error
}

// proc is one child process.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	done    chan struct{} // closed when the process has exited
	err     error         // its exit, valid once done is closed
}

// startStack starts the api on a free 127.0.0.1 port and cfg.workers workers, and returns once
// /healthz answers and every worker has registered its asynq server for cfg.queue. On error
// every process started is stopped.
func startStack(ctx context.Context, cfg stackConfig) (st *stack, err error) {
	st = &stack{}
	defer func() {
		if err != nil {
			_ = st.stop()
			st = nil
		}
	}()
	addr, err := freeAddr()
	if err != nil {
		return st, err
	}
	st.apiURL = "http://" + addr
	env := childEnv(os.Environ(), cfg.env)
	api, err := startProc(filepath.Join(cfg.bin, "api"), "api", cfg.logDir, env, "--config", cfg.configPath, "--listen", addr)
	if err != nil {
		return st, err
	}
	st.procs = append(st.procs, api)
	for i := range cfg.workers {
		w, err := startProc(filepath.Join(cfg.bin, "worker"), fmt.Sprintf("worker-%d", i+1), cfg.logDir, env, "--config", cfg.configPath)
		if err != nil {
			return st, err
		}
		st.procs = append(st.procs, w)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := st.waitReady(ctx, cfg); err != nil {
		return st, err
	}
	return st, nil
}

// waitReady polls /healthz and asynq's server list until the stack is up, a process exits, or
// ctx ends.
func (st *stack) waitReady(ctx context.Context, cfg stackConfig) error {
	opt, err := asynq.ParseRedisURI(cfg.redisURL)
	if err != nil {
		return fmt.Errorf("parse -redis-url: %w", err)
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	pids := map[int]bool{}
	for _, p := range st.procs[1:] {
		pids[p.cmd.Process.Pid] = true
	}
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	apiUp, workersUp := false, 0
	for {
		if err := st.exited(); err != nil {
			return err
		}
		if !apiUp {
			if resp, err := hc.Get(st.apiURL + "/healthz"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				apiUp = resp.StatusCode == http.StatusOK
			}
		}
		if servers, err := insp.Servers(); err == nil {
			workersUp = 0
			for _, s := range servers {
				if pids[s.PID] && s.Queues[cfg.queue] > 0 {
					workersUp++
				}
			}
		}
		if apiUp && workersUp == len(pids) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack not ready (api healthy: %t, workers registered: %d/%d): %w",
				apiUp, workersUp, len(pids), context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// exited returns an error naming the first process that ended, with the end of its log; nil
// while all run.
func (st *stack) exited() error {
	for _, p := range st.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited early (%v); end of %s:\n%s", p.name, p.err, p.logPath, tail(p.logPath, 15))
		default:
		}
	}
	return nil
}

// stop sends SIGTERM to every process, waits up to 20 s for each (a worker drains for up to
// 10 s), then kills what is left. It is idempotent and returns the first unclean exit.
func (st *stack) stop() error {
	st.once.Do(func() {
		for _, p := range st.procs {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		deadline := time.After(20 * time.Second)
		var errs []error
		for _, p := range st.procs {
			select {
			case <-p.done:
			case <-deadline:
				_ = p.cmd.Process.Kill()
				<-p.done
				errs = append(errs, fmt.Errorf("%s did not stop within 20s; killed", p.name))
			}
			if p.err != nil && !isTermination(p.err) {
				errs = append(errs, fmt.Errorf("%s: %w", p.name, p.err))
			}
			_ = p.log.Close()
		}
		st.err = errors.Join(errs...)
	})
	return st.err
}

// isTermination reports whether a process ended by our SIGTERM.
func isTermination(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}

// startProc starts binary with its stdout and stderr in <logDir>/<name>.log.
func startProc(binary, name, logDir string, env []string, args ...string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log for %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	setChildAttrs(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// childEnv is base without the variables that would override the config file, plus extra.
func childEnv(base, extra []string) []string {
	out := slices.DeleteFunc(slices.Clone(base), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == config.EnvConfig || k == config.EnvDatabaseURL || k == config.EnvRedisURL || k == simKeyEnv
	})
	return append(out, extra...)
}

// tail returns the last n lines of the file at path (or why it cannot).
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// repoRoot is the llmq checkout whose api and worker are measured: the bench runs in bench/.
const repoRoot = ".."

// ensureBinaries builds the api and worker into bin when either is missing (or always with
// force), and warns when they are older than the sources they are built from.
func ensureBinaries(ctx context.Context, bin string, force bool, stderr io.Writer) error {
	missing := false
	for _, name := range []string{"api", "worker"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			missing = true
		}
	}
	if !missing && !force {
		if src := newerSource(filepath.Join(bin, "worker"), filepath.Join(repoRoot, "cmd"), filepath.Join(repoRoot, "internal"),
			filepath.Join(repoRoot, "migrations")); src != "" {
			fmt.Fprintf(stderr, "herd: warning: %s is older than %s; run `make build` or pass -build to measure the current code\n",
				filepath.Join(bin, "worker"), src)
		}
		return nil
	}
	out, err := filepath.Abs(bin)
	if err != nil {
		return fmt.Errorf("-bin: %w", err)
	}
	args := []string{"build", "-o", out + string(filepath.Separator), "./cmd/api", "./cmd/worker"}
	fmt.Fprintf(stderr, "herd: building the binaries in %s: go %s\n", repoRoot, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = repoRoot
	cmd.Stdout, cmd.Stderr = stderr, stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s (run the bench from bench/, or pass -bin): %w", strings.Join(args, " "), err)
	}
	return nil
}

// newerSource returns a .go or .sql file under dirs modified after the file at binary, or "".
func newerSource(binary string, dirs ...string) string {
	bi, err := os.Stat(binary)
	if err != nil {
		return ""
	}
	var found string
	errFound := errors.New("found")
	for _, d := range dirs {
		_ = filepath.WalkDir(d, func(path string, de os.DirEntry, err error) error {
			if err != nil || de.IsDir() || (!strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, ".sql")) ||
				strings.HasSuffix(path, "_test.go") {
				return nil
			}
			if fi, err := de.Info(); err == nil && fi.ModTime().After(bi.ModTime()) {
				found = path
				return errFound
			}
			return nil
		})
		if found != "" {
			return found
		}
	}
	return ""
}
