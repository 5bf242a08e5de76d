package main

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// tracker records, per job index, when the job was submitted and when it completed, for the
// in-process systems. It is safe for concurrent use; a second completion of one job (an
// at-least-once redelivery) is ignored.
type tracker struct {
	base time.Time
	sub  []atomic.Int64 // ns since base + 1; 0: not yet
	done []atomic.Int64
	n    atomic.Int64 // completions
}

func newTracker(total int) *tracker {
	return &tracker{base: time.Now(), sub: make([]atomic.Int64, total), done: make([]atomic.Int64, total)}
}

func (t *tracker) stamp() int64 { return int64(time.Since(t.base)) + 1 }

// submitted records that job i is being submitted now.
func (t *tracker) submitted(i int) { t.sub[i].Store(t.stamp()) }

// completed records that job i completed now; out-of-range indices are ignored.
func (t *tracker) completed(i int) {
	if i < 0 || i >= len(t.done) {
		return
	}
	if t.done[i].CompareAndSwap(0, t.stamp()) {
		t.n.Add(1)
	}
}

// outcome returns submit → completion of the jobs submitted at or after since and the last
// completion among them.
func (t *tracker) outcome(since time.Time) tpOutcome {
	from := int64(since.Sub(t.base)) + 1
	var out tpOutcome
	var last int64
	for i := range t.sub {
		s, d := t.sub[i].Load(), t.done[i].Load()
		if s == 0 || s < from || d == 0 {
			continue
		}
		out.lat = append(out.lat, time.Duration(d-s))
		last = max(last, d)
	}
	out.last = t.base.Add(time.Duration(last - 1))
	return out
}

// asynqServerConfig is the asynq configuration of the in-process rows: the queue, the
// concurrency, and the idle poll llmq's worker uses.
func asynqServerConfig(queue string, concurrency int) asynq.Config {
	return asynq.Config{
		Concurrency:       concurrency,
		Queues:            map[string]int{queue: 1},
		TaskCheckInterval: 10 * time.Millisecond,
		LogLevel:          asynq.WarnLevel,
	}
}

const tpTaskType = "bench:throughput"

// inProcessQueue is what the queues run in this process share: the tracker of their submits and
// completions, which answers the bench's questions, the database and Redis whose CPU they are
// metered by, and their cleanups.
type inProcessQueue struct {
	o   tpOpts
	t   *tracker
	db  string // the run's database; "": none (plain asynq)
	rdb redis.UniversalClient
	c   cleanups
}

func (q *inProcessQueue) completed(context.Context) (int, error) { return int(q.t.n.Load()), nil }
func (q *inProcessQueue) pollEvery() time.Duration               { return 2 * time.Millisecond }
func (q *inProcessQueue) results(_ context.Context, since time.Time) (tpOutcome, error) {
	return q.t.outcome(since), nil
}
func (q *inProcessQueue) close() { q.c.run() }

func (q *inProcessQueue) meter() *cpuMeter {
	if q.db == "" {
		return &cpuMeter{rdb: q.rdb}
	}
	return &cpuMeter{adminURL: q.o.dbURL, db: q.db, rdb: q.rdb}
}

// asynqSystem is plain asynq with a no-op handler, producers and server in this process.
type asynqSystem struct {
	inProcessQueue
	client *asynq.Client
	queue  string
}

func (s *asynqSystem) prepare(ctx context.Context, total int) error {
	opt, rdb, err := redisFor(ctx, s.o.redisURL)
	if err != nil {
		return err
	}
	s.rdb = rdb
	s.c.add(func() { rdb.Close() })
	s.queue = "bench-tp-asynq-" + randHex(6)
	s.c.add(func() { cleanQueue(rdb, s.queue) })
	s.t = newTracker(total)
	srv := asynq.NewServer(opt, asynqServerConfig(s.queue, s.o.concurrency()))
	h := asynq.HandlerFunc(func(_ context.Context, t *asynq.Task) error {
		i, err := strconv.Atoi(string(t.Payload()))
		if err != nil {
			return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
		}
		s.t.completed(i)
		return nil
	})
	if err := srv.Start(h); err != nil {
		return fmt.Errorf("start asynq server: %w", err)
	}
	s.c.add(srv.Shutdown)
	s.client = asynq.NewClient(opt)
	s.c.add(func() { s.client.Close() })
	return nil
}

func (s *asynqSystem) submit(ctx context.Context, i int) error {
	s.t.submitted(i)
	_, err := s.client.EnqueueContext(ctx, asynq.NewTask(tpTaskType, []byte(strconv.Itoa(i))), asynq.Queue(s.queue))
	if err != nil {
		return fmt.Errorf("enqueue task %d: %w", i, err)
	}
	return nil
}

// River's fetch timing in its row: River polls at FetchPollInterval and, woken by insert
// notifications, fetches at most once per FetchCooldown (defaults 1 s and 100 ms: 100 ms would cap
// a queue at MaxWorkers jobs per 100 ms and put ~50 ms on every job). Set short, as asynq's
// TaskCheckInterval is for llmq.
const (
	riverFetchCooldown = 10 * time.Millisecond
	riverFetchPoll     = 50 * time.Millisecond
)

// riverArgs is the job of the River row.
type riverArgs struct {
	I int `json:"i"`
}

// Kind implements river.JobArgs.
func (riverArgs) Kind() string { return "bench_throughput" }

// riverWorker is River's no-op worker: it records the completion.
type riverWorker struct {
	river.WorkerDefaults[riverArgs]
	t *tracker
}

// Work implements river.Worker.
func (w *riverWorker) Work(_ context.Context, j *river.Job[riverArgs]) error {
	w.t.completed(j.Args.I)
	return nil
}

// riverSystem is River with a no-op worker on a fresh database, producers and workers in this
// process.
type riverSystem struct {
	inProcessQueue
	client *river.Client[pgx.Tx]
	pool   *pgxpool.Pool
}

// openBenchPool creates database name and opens a pool of conns connections on it.
func openBenchPool(ctx context.Context, c *cleanups, adminURL, name string, conns int) (*pgxpool.Pool, error) {
	dbURL, drop, err := createDatabase(ctx, adminURL, name)
	if err != nil {
		return nil, err
	}
	c.add(drop)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open pool on %s: %w", name, err)
	}
	c.add(pool.Close)
	return pool, nil
}

func (s *riverSystem) prepare(ctx context.Context, total int) error {
	s.db = "llmq_bench_river_" + randHex(6)
	pool, err := openBenchPool(ctx, &s.c, s.o.dbURL, s.db, s.o.conns)
	if err != nil {
		return err
	}
	s.pool = pool
	driver := riverpgxv5.New(pool)
	mig, err := rivermigrate.New(driver, nil)
	if err != nil {
		return fmt.Errorf("river migrator: %w", err)
	}
	if _, err := mig.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river migrate: %w", err)
	}
	s.t = newTracker(total)
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &riverWorker{t: s.t}); err != nil {
		return fmt.Errorf("river worker: %w", err)
	}
	client, err := river.NewClient(driver, &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: s.o.concurrency()}},
		Workers:           workers,
		FetchCooldown:     riverFetchCooldown,
		FetchPollInterval: riverFetchPoll,
		Logger:            slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	s.client = client
	if err := client.Start(ctx); err != nil {
		return fmt.Errorf("start river: %w", err)
	}
	s.c.add(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = client.Stop(sctx)
	})
	_, rdb, err := redisFor(ctx, s.o.redisURL)
	if err == nil {
		s.rdb = rdb
		s.c.add(func() { rdb.Close() })
	}
	return nil
}

func (s *riverSystem) submit(ctx context.Context, i int) error {
	s.t.submitted(i)
	if _, err := s.client.Insert(ctx, riverArgs{I: i}, nil); err != nil {
		return fmt.Errorf("river insert %d: %w", i, err)
	}
	return nil
}

// benchJobsDDL creates the floors' table of jobs.
const benchJobsDDL = `CREATE TABLE bench_jobs (
	id bigint PRIMARY KEY,
	status text NOT NULL DEFAULT 'queued',
	request jsonb NOT NULL,
	result jsonb,
	created_at timestamptz NOT NULL DEFAULT now(),
	finished_at timestamptz
)`

// floorBase is what the two floor rows share: a fresh database holding the bench_jobs table, an
// asynq queue with its server and client, and the tracker of the in-process completions.
type floorBase struct {
	inProcessQueue
	pool   *pgxpool.Pool
	client *asynq.Client
	queue  string
	opt    asynq.RedisConnOpt
}

// prepareStores creates the database llmq_bench_<kind>_<random> with the bench_jobs table, the
// queue bench-tp-<kind>-<random> and its client, and a tracker for total jobs.
func (b *floorBase) prepareStores(ctx context.Context, kind string, total int) error {
	b.db = "llmq_bench_" + kind + "_" + randHex(6)
	pool, err := openBenchPool(ctx, &b.c, b.o.dbURL, b.db, b.o.conns)
	if err != nil {
		return err
	}
	b.pool = pool
	if _, err := pool.Exec(ctx, benchJobsDDL); err != nil {
		return fmt.Errorf("create bench_jobs: %w", err)
	}
	opt, rdb, err := redisFor(ctx, b.o.redisURL)
	if err != nil {
		return err
	}
	b.opt, b.rdb = opt, rdb
	b.c.add(func() { rdb.Close() })
	b.queue = "bench-tp-" + kind + "-" + randHex(6)
	b.c.add(func() { cleanQueue(rdb, b.queue) })
	b.t = newTracker(total)
	b.client = asynq.NewClient(opt)
	b.c.add(func() { b.client.Close() })
	return nil
}

// startServer starts the queue's asynq server with handler h.
func (b *floorBase) startServer(h asynq.Handler) error {
	srv := asynq.NewServer(b.opt, asynqServerConfig(b.queue, b.o.concurrency()))
	if err := srv.Start(h); err != nil {
		return fmt.Errorf("start asynq server: %w", err)
	}
	b.c.add(srv.Shutdown)
	return nil
}

// compositeSystem is the floor of a Postgres-then-asynq design: insert a row, enqueue its task,
// and a handler that marks the row done, all in this process.
type compositeSystem struct {
	floorBase
}

func (s *compositeSystem) prepare(ctx context.Context, total int) error {
	if err := s.prepareStores(ctx, "floor", total); err != nil {
		return err
	}
	return s.startServer(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		i, err := strconv.Atoi(string(t.Payload()))
		if err != nil {
			return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
		}
		if _, err := s.pool.Exec(ctx, `UPDATE bench_jobs SET status = 'done', finished_at = now() WHERE id = $1 AND status = 'queued'`, i); err != nil {
			return fmt.Errorf("mark job %d done: %w", i, err)
		}
		s.t.completed(i)
		return nil
	}))
}

func (s *compositeSystem) submit(ctx context.Context, i int) error {
	s.t.submitted(i)
	if _, err := s.pool.Exec(ctx, `INSERT INTO bench_jobs (id, request) VALUES ($1, $2)`, i, messagesBody(i)); err != nil {
		return fmt.Errorf("insert job %d: %w", i, err)
	}
	id := strconv.Itoa(i)
	if _, err := s.client.EnqueueContext(ctx, asynq.NewTask(tpTaskType, []byte(id)), asynq.Queue(s.queue), asynq.TaskID(id)); err != nil {
		return fmt.Errorf("enqueue job %d: %w", i, err)
	}
	return nil
}
