package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/llmsim"
)

// llmqPollEvery is how often the llmq system counts its unfinished jobs.
const llmqPollEvery = 50 * time.Millisecond

// llmqMaxAttempts is the max_attempts of every throughput job (the provider never fails).
const llmqMaxAttempts = 3

// llmqJobTimeout is every throughput job's deadline: long enough for a backlog of 100,000 jobs
// at a few hundred per second, so that no job fails on its deadline while it waits.
const llmqJobTimeout = 2 * time.Hour

// llmqSystem is llmq end to end: the api binary and -workers worker binaries on a fresh
// database and queue, an instant llmsim, and jobs submitted over HTTP. Completion is observed
// with a count of unfinished jobs, never with per-job GETs.
type llmqSystem struct {
	o   tpOpts
	log logf
	// setup is the config's setup beyond the stores, queue and simulator (zero: llmq's defaults).
	setup llmqSetup
	// serve runs -workers `llmq serve` processes (an API and a worker in each) instead of an
	// api and -workers workers; submits go round the APIs.
	serve bool

	c         cleanups
	d         *deployment
	st        *stack
	hc        *http.Client
	obs       *pgxpool.Pool // the completion observer
	rdb       redis.UniversalClient
	submitted atomic.Int64
	failed    bool
}

func (s *llmqSystem) prepare(ctx context.Context, total int) (err error) {
	defer func() { s.failed = err != nil }()
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	s.c.add(sim.Close)
	if s.d, err = deploy(ctx, deployOpts{adminURL: s.o.dbURL, redisURL: s.o.redisURL, simURL: sim.URL, setup: s.setup}); err != nil {
		return err
	}
	s.c.add(func() { s.d.close(s.o.keepLogs || s.failed, s.log) })
	cfg := s.d.stack(s.o.bin, s.o.redisURL)
	cfg.metrics = true
	cfg.serve = s.serve
	cfg.gomaxprocs = s.o.gomaxprocs
	if s.st, err = startStack(ctx, cfg, s.o.workers); err != nil {
		return err
	}
	s.c.add(func() {
		if err := s.st.stop(); err != nil {
			s.log("  stopping llmq: %v", err)
		}
	})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = s.o.clients + openLoopMaxInFlight
	tr.MaxIdleConnsPerHost = tr.MaxIdleConns
	s.hc = &http.Client{Transport: tr, Timeout: 30 * time.Second}
	s.c.add(s.hc.CloseIdleConnections)
	pcfg, err := pgxpool.ParseConfig(s.d.dbURL)
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

func (s *llmqSystem) submit(ctx context.Context, i int) error {
	if _, err := submitJob(ctx, s.hc, s.st.apiURLs[i%len(s.st.apiURLs)], i, jobBody(messagesBody(i), llmqMaxAttempts, llmqJobTimeout)); err != nil {
		return err
	}
	s.submitted.Add(1)
	return nil
}

// completed is the jobs submitted less those not yet terminal (an index scan of
// jobs_unfinished_deadline_idx, whose cost follows the unfinished jobs, not the table).
func (s *llmqSystem) completed(ctx context.Context) (int, error) {
	if err := s.st.exited(); err != nil {
		return 0, err
	}
	return completedRows(ctx, s.obs, int(s.submitted.Load()),
		`SELECT count(*) FROM jobs WHERE status IN ('queued', 'running', 'retrying')`)
}

func (s *llmqSystem) pollEvery() time.Duration { return llmqPollEvery }

// results reads the jobs' times from their rows: submit → result is created_at → finished_at.
func (s *llmqSystem) results(ctx context.Context, since time.Time) (tpOutcome, error) {
	return rowOutcome(ctx, s.obs, since, nil,
		`SELECT status, created_at, started_at, finished_at FROM jobs WHERE created_at >= $1`)
}

// completedRows is submitted less the count countUnfinished reads.
func completedRows(ctx context.Context, obs *pgxpool.Pool, submitted int, countUnfinished string) (int, error) {
	n, err := countRows(ctx, obs, countUnfinished)
	return submitted - n, err
}

// rowOutcome reads the outcome of the jobs created at or after since from query, whose rows
// are (status, created, started or NULL, finished or NULL) and whose $1 is since; status maps a
// row's status to the tables' words (nil: as it is).
func rowOutcome(ctx context.Context, obs *pgxpool.Pool, since time.Time, status func(string) string, query string) (tpOutcome, error) {
	rows, err := obs.Query(ctx, query, since)
	if err != nil {
		return tpOutcome{}, fmt.Errorf("read jobs: %w", err)
	}
	out := tpOutcome{statuses: map[string]int{}}
	var st string
	var created time.Time
	var started, finished *time.Time
	_, err = pgx.ForEachRow(rows, []any{&st, &created, &started, &finished}, func() error {
		if status != nil {
			st = status(st)
		}
		out.statuses[st]++
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
	m := &cpuMeter{adminURL: s.o.dbURL, db: s.d.dbName, rdb: s.rdb}
	if s.st.api != nil {
		m.api = s.st.api.pid()
	}
	m.workers = s.st.workerPIDs()
	return m
}

func (s *llmqSystem) close() { s.c.run() }

// stageTotals reads the delivery stages from the workers' /metrics and the submit stages from
// the API's (serve: the same /metrics); ok is false when they could not be read.
func (s *llmqSystem) stageTotals(ctx context.Context) (map[string]stageTotal, bool) {
	if len(s.st.metricsAddrs) == 0 {
		return nil, false
	}
	out, err := scrapeStageTotals(ctx, s.hc, stageAddrs(s.st, s.st.apiURLs))
	if err != nil {
		s.log("  worker stages not read: %v", err)
		return nil, false
	}
	return out, true
}
