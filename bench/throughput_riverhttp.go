package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/migrations"
)

// riverHTTPPollEvery is how often the River over HTTP system counts its unfinished jobs.
const riverHTTPPollEvery = llmqPollEvery

// riverHTTPSystem is River used as a team would use it for llmq's job: an API process whose
// POST inserts a River job holding the request, and -workers River worker processes (MaxWorkers
// 200 each, like llmq's per-process concurrency) that send the request to the simulator and
// store the answer with river.RecordOutput. The processes are this binary run with the hidden
// commands river-api and river-worker, each with a pool as large as llmq's processes'. As for
// llmq, completion is observed with a count of unfinished jobs, and submit → result is read
// from the job rows (created_at → finalized_at).
type riverHTTPSystem struct {
	o   tpOpts
	log logf

	c         cleanups
	dir       string // the processes' logs
	db        string
	obs       *pgxpool.Pool // migrations and the completion observer
	rdb       redis.UniversalClient
	hc        *http.Client
	apiURL    string
	api       *proc
	workers   []*proc
	submitted atomic.Int64
	failed    bool
}

func (s *riverHTTPSystem) prepare(ctx context.Context, total int) (err error) {
	defer func() { s.failed = err != nil }()
	if s.dir, err = os.MkdirTemp("", "llmq-bench-riverhttp-"); err != nil {
		return fmt.Errorf("create temp dir: %w", err)
	}
	s.c.add(s.removeLogs)
	s.db = "llmq_bench_riverhttp_" + randHex(6)
	dbURL, drop, err := createDatabase(ctx, s.o.dbURL, s.db)
	if err != nil {
		return err
	}
	s.c.add(drop)
	if err := s.openObserver(ctx, dbURL); err != nil {
		return err
	}
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	s.c.add(sim.Close)
	if err := s.startProcs(ctx, riverProcConfig{
		dbURL:         dbURL,
		conns:         migrations.DefaultPoolMaxConns,
		simURL:        sim.URL,
		maxWorkers:    s.o.concurrency() / s.o.workers,
		fetchCooldown: riverFetchCooldown,
		fetchPoll:     riverFetchPoll,
	}); err != nil {
		return err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = s.o.clients + openLoopMaxInFlight
	tr.MaxIdleConnsPerHost = tr.MaxIdleConns
	s.hc = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	s.c.add(s.hc.CloseIdleConnections)
	if _, rdb, err := redisFor(ctx, s.o.redisURL); err == nil {
		s.rdb = rdb
		s.c.add(func() { rdb.Close() })
	}
	return nil
}

// openObserver opens the bench's own pool on the database (not metered as the system's) and
// migrates River's tables up with it.
func (s *riverHTTPSystem) openObserver(ctx context.Context, dbURL string) error {
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("parse database url: %w", err)
	}
	pcfg.MaxConns = 2
	pcfg.ConnConfig.RuntimeParams["application_name"] = observerApp
	if s.obs, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return fmt.Errorf("open observer pool: %w", err)
	}
	s.c.add(s.obs.Close)
	mig, err := rivermigrate.New(riverpgxv5.New(s.obs), nil)
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	return nil
}

// startProcs starts the api and the workers, each on a free port, and returns once every one
// answers /healthz.
func (s *riverHTTPSystem) startProcs(ctx context.Context, cfg riverProcConfig) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find this binary to run the River processes: %w", err)
	}
	s.c.add(s.stopProcs)
	var urls []string
	start := func(cmd, name string) (*proc, error) {
		if cfg.listen, err = freeAddr(); err != nil {
			return nil, err
		}
		urls = append(urls, "http://"+cfg.listen)
		return startProc(exe, name, s.dir, os.Environ(), cfg.args(cmd)...)
	}
	if s.api, err = start(riverAPICmd, "river-api"); err != nil {
		return err
	}
	s.apiURL = urls[0]
	for k := range s.o.workers {
		p, err := start(riverWorkerCmd, fmt.Sprintf("river-worker-%d", k+1))
		if err != nil {
			return err
		}
		s.workers = append(s.workers, p)
	}
	return waitReady(ctx, s.o.redisURL, "", urls, nil, s.exited)
}

// procs are the running processes, the workers first.
func (s *riverHTTPSystem) procs() []*proc {
	out := append([]*proc(nil), s.workers...)
	if s.api != nil {
		out = append(out, s.api)
	}
	return out
}

// stopProcs stops the workers, then the api.
func (s *riverHTTPSystem) stopProcs() {
	err := stopAll(s.workers)
	if s.api != nil {
		err = errors.Join(err, stopAll([]*proc{s.api}))
	}
	s.workers, s.api = nil, nil
	if err != nil {
		s.failed = true
		s.log("  stopping River over HTTP: %v", err)
	}
}

// exited returns an error naming the first process that ended; nil while all run.
func (s *riverHTTPSystem) exited() error {
	for _, p := range s.procs() {
		if err := p.exited(); err != nil {
			return err
		}
	}
	return nil
}

// removeLogs removes the logs, or keeps them (and says where) with -keep-logs or after a failure.
func (s *riverHTTPSystem) removeLogs() {
	if s.o.keepLogs || s.failed {
		s.log("  River over HTTP: logs kept in %s", s.dir)
		return
	}
	_ = os.RemoveAll(s.dir)
}

func (s *riverHTTPSystem) submit(ctx context.Context, i int) error {
	if err := postBenchJob(ctx, s.hc, s.apiURL, i, fmt.Appendf(nil, `{"request":%s}`, messagesBody(i))); err != nil {
		return err
	}
	s.submitted.Add(1)
	return nil
}

// completed is the jobs submitted less those River has not finalized (an index scan of River's
// fetch index, whose leading column is the state).
func (s *riverHTTPSystem) completed(ctx context.Context) (int, error) {
	if err := s.exited(); err != nil {
		return 0, err
	}
	return completedRows(ctx, s.obs, int(s.submitted.Load()),
		`SELECT count(*) FROM river_job WHERE state IN ('available', 'pending', 'retryable', 'running', 'scheduled')`)
}

func (s *riverHTTPSystem) pollEvery() time.Duration { return riverHTTPPollEvery }

// results reads the jobs' times from River's rows: submit → result is created_at →
// finalized_at (the worker's clock when the job completed; River's completer writes it in
// batches a moment later), the wait before the call ends at attempted_at. River's completed is
// reported as succeeded.
func (s *riverHTTPSystem) results(ctx context.Context, since time.Time) (tpOutcome, error) {
	return rowOutcome(ctx, s.obs, since, riverStatus,
		`SELECT state, created_at, attempted_at, finalized_at FROM river_job WHERE created_at >= $1`)
}

// riverStatus is River's job state in the tables' words: completed is succeeded.
func riverStatus(state string) string {
	if state == "completed" {
		return "succeeded"
	}
	return state
}

func (s *riverHTTPSystem) meter() *cpuMeter {
	m := &cpuMeter{adminURL: s.o.dbURL, db: s.db, rdb: s.rdb}
	if s.api != nil {
		m.api = s.api.pid()
	}
	for _, p := range s.workers {
		m.workers = append(m.workers, p.pid())
	}
	return m
}

func (s *riverHTTPSystem) close() { s.c.run() }
