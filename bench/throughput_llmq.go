package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// llmqPollEvery is how often the llmq system counts its unfinished jobs.
const llmqPollEvery = 50 * time.Millisecond

// llmqMaxAttempts is the max_attempts of every benchmark job (the provider never fails).
const llmqMaxAttempts = 3

// llmqJobTimeout is every benchmark job's deadline: long enough for a backlog of 100,000 jobs
// at a few hundred per second, so that no job fails on its deadline while it waits.
const llmqJobTimeout = 2 * time.Hour

// tpSubmitBody is the POST /v1/jobs body of job i.
func tpSubmitBody(i int) []byte {
	return fmt.Appendf(nil, `{"request":%s,"max_attempts":%d,"timeout":%q}`, messagesBody(i), llmqMaxAttempts, llmqJobTimeout.String())
}

// llmqSystem is llmq end to end: the api binary and worker binaries on a fresh database and
// queue, an instant llmsim, and jobs submitted over HTTP.
type llmqSystem struct {
	o      tpOpts
	stderr io.Writer
	// workersAtStart starts o.workers worker processes in prepare; without, startWorkers does.
	workersAtStart bool

	c         cleanups
	dir       string
	dbName    string
	dbURL     string
	cfgPath   string
	cfg       *config.Config
	apiKey    string
	simURL    string
	apiURL    string
	st        *stack  // the api process
	workers   []*proc // the worker processes
	workerGen int     // worker processes started so far, for their names
	hc        *http.Client
	obs       *pgxpool.Pool // the completion observer
	// metricsAddrs are the worker processes' /metrics listeners.
	metricsAddrs []string
	rdb          redis.UniversalClient
	submitted    atomic.Int64
	failed       bool
}

func (s *llmqSystem) prepare(ctx context.Context, total int) (err error) {
	defer func() { s.failed = err != nil }()
	suffix := randHex(6)
	if s.dir, err = os.MkdirTemp("", "llmq-bench-tp-"); err != nil {
		return fmt.Errorf("create temp dir: %w", err)
	}
	s.c.add(func() {
		if s.o.keepLogs || s.failed {
			tpLogf(s.stderr, "  config and logs kept in %s", s.dir)
			return
		}
		_ = os.RemoveAll(s.dir)
	})
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	s.c.add(sim.Close)
	s.simURL = sim.URL
	s.dbName = "llmq_bench_" + suffix
	dbURL, drop, err := createDatabase(ctx, s.o.dbURL, s.dbName)
	if err != nil {
		return err
	}
	s.c.add(drop)
	s.dbURL = dbURL
	queue := "llmq-bench-" + suffix
	s.apiKey = "sk-bench-" + randHex(8)
	s.cfgPath = filepath.Join(s.dir, "llmq.yaml")
	if s.cfg, err = writeConfig(s.cfgPath, s.dbURL, s.o.redisURL, queue, s.simURL, s.apiKey, llmqSetup{}); err != nil {
		return err
	}
	s.c.add(func() { cleanLLMQRedis(s.o.redisURL, queue, s.cfg.Credentials[0].LimiterID()) })
	st, err := startStack(ctx, stackConfig{bin: s.o.bin, configPath: s.cfgPath, workers: 0, logDir: s.dir,
		env: []string{simKeyEnv + "=" + s.apiKey}, redisURL: s.o.redisURL, queue: queue})
	if err != nil {
		return err
	}
	s.st = st
	s.apiURL = st.apiURL
	s.c.add(func() {
		_ = s.stopWorkers()
		if err := st.stop(); err != nil {
			tpLogf(s.stderr, "  stopping the api: %v", err)
		}
	})
	if s.workersAtStart {
		if err := s.startWorkers(ctx); err != nil {
			return err
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = s.o.clients + openLoopMaxInFlight
	tr.MaxIdleConnsPerHost = s.o.clients + openLoopMaxInFlight
	s.hc = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	s.c.add(s.hc.CloseIdleConnections)
	pcfg, err := pgxpool.ParseConfig(s.dbURL)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	pcfg.MaxConns = 2
	pcfg.ConnConfig.RuntimeParams["application_name"] = observerApp
	if s.obs, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fmt.Errorf("open observer pool: %w", err)
	}
	s.c.add(s.obs.Close)
	if _, rdb, err := redisFor(ctx, s.o.redisURL); err == nil {
		s.rdb = rdb
		s.c.add(func() { rdb.Close() })
	}
	return nil
}

// startWorkers starts o.workers worker processes and waits until each has registered its asynq
// server for the queue.
func (s *llmqSystem) startWorkers(ctx context.Context) error {
	env := childEnv(os.Environ(), []string{simKeyEnv + "=" + s.apiKey})
	pids := map[int]bool{}
	for range s.o.workers {
		s.workerGen++
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		p, err := startProc(filepath.Join(s.o.bin, "worker"), fmt.Sprintf("worker-%d", s.workerGen), s.dir, env,
			"--config", s.cfgPath, "--metrics-listen", addr)
		if err != nil {
			return err
		}
		s.workers = append(s.workers, p)
		s.metricsAddrs = append(s.metricsAddrs, addr)
		pids[p.cmd.Process.Pid] = true
	}
	opt, err := asynq.ParseRedisURI(s.o.redisURL)
	if err != nil {
		return fmt.Errorf("parse -redis-url: %w", err)
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := s.exited(); err != nil {
			return err
		}
		up := 0
		if servers, err := insp.Servers(); err == nil {
			for _, sv := range servers {
				if pids[sv.PID] && sv.Queues[s.cfg.Worker.Queue] > 0 {
					up++
				}
			}
		}
		if up == len(pids) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("workers not registered (%d/%d): %w", up, len(pids), context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// stopWorkers sends SIGTERM to the worker processes, waits up to 20 s for them (a worker drains
// for up to 10 s), kills what is left, and forgets them.
func (s *llmqSystem) stopWorkers() error {
	for _, p := range s.workers {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(20 * time.Second)
	var errs []error
	for _, p := range s.workers {
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
	s.workers, s.metricsAddrs = nil, nil
	return errors.Join(errs...)
}

// exited returns an error naming the first process of the system that ended.
func (s *llmqSystem) exited() error {
	if s.st != nil {
		if err := s.st.exited(); err != nil {
			return err
		}
	}
	for _, p := range s.workers {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited early (%v); end of %s:\n%s", p.name, p.err, p.logPath, tail(p.logPath, 15))
		default:
		}
	}
	return nil
}

func (s *llmqSystem) submit(ctx context.Context, i int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.apiURL+"/v1/jobs", bytes.NewReader(tpSubmitBody(i)))
	if err != nil {
		return fmt.Errorf("job %d: %w", i, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.hc.Do(req)
	if err != nil {
		return fmt.Errorf("job %d: %w", i, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("job %d: POST /v1/jobs answered %d: %s", i, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("job %d: read answer: %w", i, err)
	}
	s.submitted.Add(1)
	return nil
}

// unfinished counts the jobs not yet terminal (an index scan of jobs_unfinished_idx, whose cost
// follows the unfinished jobs, not the table).
func (s *llmqSystem) unfinished(ctx context.Context) (int, error) {
	var n int
	err := s.obs.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE status IN ('queued', 'running', 'retrying')`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count unfinished jobs: %w", err)
	}
	return n, nil
}

func (s *llmqSystem) completed(ctx context.Context) (int, error) {
	if err := s.exited(); err != nil {
		return 0, err
	}
	n, err := s.unfinished(ctx)
	if err != nil {
		return 0, err
	}
	return int(s.submitted.Load()) - n, nil
}

func (s *llmqSystem) pollEvery() time.Duration { return llmqPollEvery }

func (s *llmqSystem) results(ctx context.Context, since time.Time) (tpOutcome, error) {
	rows, err := s.obs.Query(ctx, `SELECT status, created_at, started_at, finished_at FROM jobs WHERE created_at >= $1`, since)
	if err != nil {
		return tpOutcome{}, fmt.Errorf("read jobs: %w", err)
	}
	out := tpOutcome{statuses: map[string]int{}}
	var status string
	var created time.Time
	var started, finished *time.Time
	_, err = pgx.ForEachRow(rows, []any{&status, &created, &started, &finished}, func() error {
		out.statuses[status]++
		if finished == nil {
			return nil
		}
		out.lat = append(out.lat, finished.Sub(created))
		if started != nil {
			out.toStart = append(out.toStart, started.Sub(created))
			out.fromStart = append(out.fromStart, finished.Sub(*started))
		}
		if finished.After(out.last) {
			out.last = *finished
		}
		return nil
	})
	if err != nil {
		return tpOutcome{}, fmt.Errorf("read jobs: %w", err)
	}
	return out, nil
}

func (s *llmqSystem) meter() *cpuMeter {
	m := &cpuMeter{adminURL: s.o.dbURL, db: s.dbName, rdb: s.rdb}
	if s.st != nil {
		m.api = s.st.procs[0].cmd.Process.Pid
	}
	for _, p := range s.workers {
		m.workers = append(m.workers, p.cmd.Process.Pid)
	}
	return m
}

func (s *llmqSystem) close() { s.c.run() }

// runRateMode is `-mode rate`: each system of ids at each fixed offered rate, a fresh system for
// each run.
func runRateMode(ctx context.Context, o tpOpts, ids []string, stderr io.Writer) (tpRateReport, error) {
	rep := tpRateReport{opts: o}
	for _, rate := range o.rates {
		n := max(1, int(rate*o.duration.Seconds()))
		runs := make([][]tpResult, len(ids))
		for run := range max(1, o.runs) {
			for i, id := range ids {
				name := systemName(id)
				tpLogf(stderr, "[%d/%d] %s at %g jobs/s for %s (%d jobs)", run+1, max(1, o.runs), name, rate, o.duration, n)
				var ol openLoopStats
				res := measure(ctx, o, newSystem(o, id, stderr), id, name, n, openLoop(rate, &ol), stderr)
				res.lag, res.offered = ol.lag, ol.spread
				if ctx.Err() != nil {
					return rep, fmt.Errorf("interrupted: %w", context.Cause(ctx))
				}
				if res.err != nil {
					rep.runs = append(rep.runs, tpRateRun{rate: rate, res: res})
					fmt.Fprint(stderr, rep.text())
					return rep, res.err
				}
				tpLogf(stderr, "  p50 %s, p99 %s, submit p99 %s", msText(percentile(res.lat, 50)), msText(percentile(res.lat, 99)),
					msText(percentile(res.submit, 99)))
				runs[i] = append(runs[i], res)
			}
		}
		for i := range ids {
			rep.runs = append(rep.runs, tpRateRun{rate: rate, res: medianLatencyRun(runs[i])})
		}
	}
	return rep, nil
}

// medianLatencyRun returns the run with the median submit→result p50 of runs (all completed),
// with every run's p50 and p99 in allLat when there is more than one.
func medianLatencyRun(runs []tpResult) tpResult {
	sorted := slices.Clone(runs)
	slices.SortStableFunc(sorted, func(a, b tpResult) int {
		return cmp.Compare(percentile(a.lat, 50), percentile(b.lat, 50))
	})
	res := sorted[(len(sorted)-1)/2]
	if len(runs) > 1 {
		for _, r := range runs {
			res.allLat = append(res.allLat, [2]time.Duration{percentile(r.lat, 50), percentile(r.lat, 99)})
		}
	}
	return res
}

// stageTotals implements stageReporter: the worker processes' /metrics.
func (s *llmqSystem) stageTotals(ctx context.Context) (map[string]stageTotal, bool) {
	if len(s.metricsAddrs) == 0 {
		return nil, false
	}
	out, err := scrapeStageTotals(ctx, s.hc, s.metricsAddrs)
	if err != nil {
		tpLogf(s.stderr, "  worker stages not read: %v", err)
		return nil, false
	}
	return out, true
}
