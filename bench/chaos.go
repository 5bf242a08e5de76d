package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// chaosOpts are the flags of `bench chaos`.
type chaosOpts struct {
	n           int
	submitOver  time.Duration
	workers     int
	apis        int
	capacity    float64
	rate        float64
	latency     time.Duration
	jitter      time.Duration
	killEvery   time.Duration
	killFor     time.Duration
	flushAt     time.Duration
	pgDownAt    time.Duration
	pgDownFor   time.Duration
	grace       time.Duration
	maxAttempts int
	seed        uint64
	bin         string
	build       bool
	write       string
	dbURL       string
	redisServer string
	keepLogs    bool
}

// chaosQueue is the asynq queue of the run (its Redis is private).
const chaosQueue = "llmq-chaos"

func parseChaosFlags(args []string, stderr io.Writer) (chaosOpts, error) {
	var o chaosOpts
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.n, "n", 300, "jobs submitted")
	fs.DurationVar(&o.submitOver, "submit-over", 15*time.Second, "the submits are spread evenly over this time from the start")
	fs.IntVar(&o.workers, "workers", 3, "worker processes")
	fs.IntVar(&o.apis, "apis", 2, "api processes (submits are spread over them)")
	fs.Float64Var(&o.capacity, "capacity", 10, "the simulator's bucket capacity; also the credential's configured burst")
	fs.Float64Var(&o.rate, "rate", 10, "the simulator's refill rate (requests/s); also the credential's configured limit")
	fs.DurationVar(&o.latency, "latency", time.Second, "the simulator's latency per answer")
	fs.DurationVar(&o.jitter, "jitter", 2*time.Second, "plus U(0, jitter)")
	fs.DurationVar(&o.killEvery, "kill-every", 2*time.Second, "SIGKILL a random worker this often, and restart it at once")
	fs.DurationVar(&o.killFor, "kill-for", 20*time.Second, "for this long from the start (0: no kills)")
	fs.DurationVar(&o.flushAt, "flush-at", 7*time.Second, "FLUSHALL the run's private Redis at this time from the start (0: never)")
	fs.DurationVar(&o.pgDownAt, "pg-down-at", 11*time.Second, "cut Postgres off at this time from the start")
	fs.DurationVar(&o.pgDownFor, "pg-down-for", 5*time.Second, "for this long (0: never)")
	fs.DurationVar(&o.grace, "grace", 60*time.Second, "every accepted job must be terminal this long after the last fault ended")
	fs.IntVar(&o.maxAttempts, "max-attempts", 20, "max_attempts of each job")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the victim choice, the simulator's latency and the client's retry spread")
	fs.StringVar(&o.bin, "bin", "../bin", "directory holding the api and worker binaries (built there when missing)")
	fs.BoolVar(&o.build, "build", false, "build the api and worker binaries into -bin even when present")
	fs.StringVar(&o.write, "write", "", "Markdown file whose chaos section is replaced with the table (empty: don't write)")
	fs.StringVar(&o.dbURL, "database-url", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"Postgres server (a database llmq_bench_chaos_<random> is created there and dropped; llmq reaches it through a proxy)")
	fs.StringVar(&o.redisServer, "redis-server", "redis-server", "redis-server binary: the run starts a private one (it is flushed)")
	fs.BoolVar(&o.keepLogs, "keep-logs", false, "keep the config and the process logs (their directory is printed)")
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	switch {
	case o.n < 1:
		return o, errors.New("-n: must be at least 1")
	case o.workers < 1:
		return o, errors.New("-workers: must be at least 1")
	case o.apis < 1:
		return o, errors.New("-apis: must be at least 1")
	case o.capacity < 1:
		return o, errors.New("-capacity: must be at least 1")
	case o.rate <= 0:
		return o, errors.New("-rate: must be positive")
	case o.latency < 0 || o.jitter < 0:
		return o, errors.New("-latency, -jitter: must not be negative")
	case o.killFor > 0 && o.killEvery <= 0:
		return o, errors.New("-kill-every: must be positive")
	case o.submitOver < 0 || o.flushAt < 0 || o.pgDownAt < 0 || o.pgDownFor < 0 || o.killFor < 0:
		return o, errors.New("times must not be negative")
	case o.grace <= 0:
		return o, errors.New("-grace: must be positive")
	case o.maxAttempts < 1:
		return o, errors.New("-max-attempts: must be at least 1")
	}
	return o, nil
}

// runChaos is `bench chaos`: one run of the whole system under faults, its table on stdout,
// progress on stderr, and with -write the Markdown section. It returns an error when the run
// could not be carried out; a FAIL verdict is not an error (the table says it).
func runChaos(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseChaosFlags(args, stderr)
	if err != nil {
		return err
	}
	if err := ensureBinaries(ctx, o.bin, o.build, stderr); err != nil {
		return err
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "chaos: "+format+"\n", a...) }
	logf("%d jobs over %s to %d apis, %d workers; simulator %g/s burst %g, latency %s + U(0, %s); "+
		"SIGKILL a worker every %s for %s, FLUSHALL at %s, Postgres down at %s for %s",
		o.n, o.submitOver, o.apis, o.workers, o.rate, o.capacity, o.latency, o.jitter,
		o.killEvery, o.killFor, o.flushAt, o.pgDownAt, o.pgDownFor)
	res, err := executeChaos(ctx, o, logf)
	if err != nil {
		return err
	}
	rep := chaosReport{opts: o, sum: summarizeChaos(res), res: res,
		command: "go run . chaos " + strings.Join(args, " "), date: time.Now(), machine: machine()}
	fmt.Fprint(stdout, rep.text())
	if o.write != "" {
		if err := writeSection(o.write, chaosBegin, chaosEnd, rep.markdown()); err != nil {
			return err
		}
		logf("wrote the table to %s", o.write)
	}
	return nil
}

// executeChaos sets the system up, runs the faults and the submits, waits for the jobs and
// collects what happened. Every process, the database and the private Redis are gone when it
// returns, whatever happened.
func executeChaos(ctx context.Context, o chaosOpts, logf func(string, ...any)) (res chaosResult, err error) {
	tag := randHex(4)
	dir, err := os.MkdirTemp("", "llmq-chaos-")
	if err != nil {
		return res, fmt.Errorf("create temp dir: %w", err)
	}
	defer func() {
		if o.keepLogs || (err != nil && ctx.Err() == nil) {
			logf("config and logs kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()

	redisURL, stopRedis, err := startPrivateRedis(ctx, o.redisServer, dir)
	if err != nil {
		return res, err
	}
	defer stopRedis()

	pgTarget, err := pgHostPort(o.dbURL)
	if err != nil {
		return res, err
	}
	proxy, err := startPGProxy(pgTarget)
	if err != nil {
		return res, err
	}
	defer proxy.close()
	directURL, dropDB, err := createDatabase(ctx, o.dbURL, "llmq_bench_chaos_"+tag)
	if err != nil {
		return res, err
	}
	defer dropDB()
	proxiedURL, err := withHost(directURL, proxy.addr())
	if err != nil {
		return res, err
	}

	sim := llmsim.New(llmsim.Config{Capacity: o.capacity, RefillPerSecond: o.rate, Latency: o.latency,
		LatencyJitter: o.jitter, Rand: rand.New(rand.NewPCG(o.seed, 0x73696d)).Float64})
	callLog := newChaosCallLog(sim, tag)
	simSrv := httptest.NewServer(callLog)
	defer simSrv.Close()
	apiKey := "sk-bench-" + randHex(8)

	cfgPath := filepath.Join(dir, "llmq.yaml")
	if err := writeChaosConfig(cfgPath, proxiedURL, redisURL, simSrv.URL, apiKey, o); err != nil {
		return res, err
	}
	env := childEnv(os.Environ(), []string{simKeyEnv + "=" + apiKey})
	var apiURLs []string
	var apis, workers []*chaosSlot
	for i := range o.apis {
		addr, err := freeAddr()
		if err != nil {
			return res, err
		}
		apiURLs = append(apiURLs, "http://"+addr)
		apis = append(apis, newChaosSlot(fmt.Sprintf("api-%d", i+1), filepath.Join(o.bin, "api"), dir, env,
			"--config", cfgPath, "--listen", addr))
	}
	for i := range o.workers {
		workers = append(workers, newChaosSlot(fmt.Sprintf("worker-%d", i+1), filepath.Join(o.bin, "worker"), dir, env,
			"--config", cfgPath))
	}
	slots := append(slices.Clone(apis), workers...)
	// The api and workers migrate the new database at start-up under an advisory lock; start
	// one api first so the others find it migrated.
	apis[0].start()
	if err := waitChaosReady(ctx, apiURLs[:1], nil, apis[:1], redisURL, chaosQueue); err != nil {
		stopSlots(apis[:1])
		return res, err
	}
	for _, s := range slots[1:] {
		s.start()
	}
	defer stopSlots(slots)
	if err := waitChaosReady(ctx, apiURLs, workers, slots, redisURL, chaosQueue); err != nil {
		return res, err
	}
	logf("private redis at %s, postgres through proxy %s, %d apis and %d workers ready; logs in %s",
		redisURL, proxy.addr(), o.apis, o.workers, dir)

	admin, err := pgxpool.New(ctx, directURL)
	if err != nil {
		return res, fmt.Errorf("connect to the run's database: %w", err)
	}
	defer admin.Close()
	redisOpt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		return res, fmt.Errorf("parse redis url: %w", err)
	}
	rdb := redisOpt.MakeRedisClient().(redis.UniversalClient)
	defer rdb.Close()

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()

	res.tag = tag
	res.start = time.Now()
	start := res.start
	client := &chaosClient{hc: hc, apiURLs: apiURLs, start: start, rand: lockedRand(o.seed)}

	// Submits: job i at i·submitOver/n from the start, each retried on its own. However the run
	// ends, no submit outlives it.
	subCtx, stopSubmits := context.WithCancel(ctx)
	res.submits = make([]chaosSubmit, o.n)
	var accepted atomic.Int64
	var subWG sync.WaitGroup
	for i := range o.n {
		subWG.Go(func() {
			at := time.Duration(0)
			if o.n > 1 {
				at = o.submitOver * time.Duration(i) / time.Duration(o.n-1)
			}
			if !sleepUntil(subCtx, start.Add(at)) {
				res.submits[i] = chaosSubmit{key: chaosKey(tag, i), giveUp: "interrupted"}
				return
			}
			res.submits[i] = client.submit(subCtx, i, chaosKey(tag, i), chaosBody(tag, i), o.maxAttempts)
			if res.submits[i].accepted {
				accepted.Add(1)
			}
		})
	}
	submitsDone := make(chan struct{})
	go func() { subWG.Wait(); close(submitsDone) }()
	defer func() { stopSubmits(); <-submitsDone }()

	// Faults, on their own schedule.
	faultsDone := make(chan struct{})
	go func() {
		defer close(faultsDone)
		res.faults = runChaosFaults(ctx, o, start, workers, rdb, proxy, logf)
	}()

	stopProgress := chaosProgress(ctx, start, admin, &accepted, o.n, sim.Stats, logf)
	select {
	case <-faultsDone:
	case <-ctx.Done():
		<-faultsDone
		stopProgress()
		return res, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	for _, f := range res.faults {
		res.lastFaultEnd = max(res.lastFaultEnd, f.end)
	}
	graceAt := start.Add(res.lastFaultEnd + o.grace)
	logf("faults over at %s; every accepted job must be terminal by %s", seconds(res.lastFaultEnd),
		seconds(res.lastFaultEnd+o.grace))
	err = waitChaosJobs(ctx, &res, admin, submitsDone, graceAt, logf)
	stopProgress()
	if err != nil {
		return res, err
	}
	res.calls, res.unmarked = callLog.snapshot()
	if res.rows, err = chaosRows(ctx, admin); err != nil {
		return res, err
	}
	res.refused = proxy.refusedCount()
	stopSlots(slots)
	for _, s := range slots {
		res.exits = append(res.exits, s.unexpectedExits()...)
	}
	return res, nil
}

// chaosKey is the Idempotency-Key of job i.
func chaosKey(tag string, i int) string { return fmt.Sprintf("chaos-%s-%d", tag, i) }

// writeChaosConfig writes the run's llmq config (stores, queue, the simulator's credential with
// its limit configured) and validates it with the real loader.
func writeChaosConfig(path, dbURL, redisURL, simURL, apiKey string, o chaosOpts) error {
	yaml := fmt.Sprintf(`# Written by the bench chaos; removed afterwards.
database_url: %q
redis_url: %q
api: { allow_anonymous: true }
worker: { queue: %q, metrics_listen: "off" }
credentials:
  - name: default
    provider: anthropic
    base_url: %q
    api_key_env: %s
    limits: { requests_per_second: %g, burst: %d }
`, dbURL, redisURL, chaosQueue, simURL, simKeyEnv, o.rate, int(o.capacity))
	if _, err := config.Parse([]byte(yaml), func(k string) string {
		if k == simKeyEnv {
			return apiKey
		}
		return ""
	}); err != nil {
		return fmt.Errorf("chaos config: %w", err)
	}
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	return nil
}

// pgHostPort is the host:port of a Postgres URL (port 5432 when absent).
func pgHostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("parse -database-url: %w", err)
	}
	host := u.Hostname()
	if host == "" {
		return "", errors.New("-database-url: no host (a TCP host is needed for the proxy)")
	}
	port := u.Port()
	if port == "" {
		port = "5432"
	}
	return net.JoinHostPort(host, port), nil
}

// withHost returns raw with its host:port replaced by hostPort.
func withHost(raw, hostPort string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("parse database url: %w", err)
	}
	u.Host = hostPort
	return u.String(), nil
}

// sleepUntil waits until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// chaosFault is one injected fault, its times since the run's start.
type chaosFault struct {
	kind   string // "kill", "flush" or "postgres"
	what   string
	start  time.Duration
	end    time.Duration // when the fault was over (the worker restarted, Postgres reachable)
	detail string
	err    error
}

// runChaosFaults injects the faults of o at their times and returns them once the last is over.
func runChaosFaults(ctx context.Context, o chaosOpts, start time.Time, workers []*chaosSlot, rdb redis.UniversalClient,
	proxy *pgProxy, logf func(string, ...any)) []chaosFault {
	type action struct {
		at time.Duration
		do func()
	}
	var mu sync.Mutex
	var faults []chaosFault
	add := func(f chaosFault) int {
		mu.Lock()
		defer mu.Unlock()
		faults = append(faults, f)
		return len(faults) - 1
	}
	since := func() time.Duration { return time.Since(start) }
	var actions []action
	victims := rand.New(rand.NewPCG(o.seed, 0x6b696c6c))
	if o.killFor > 0 {
		for at := o.killEvery; at <= o.killFor; at += o.killEvery {
			v := victims.IntN(len(workers))
			actions = append(actions, action{at, func() {
				f := chaosFault{kind: "kill", what: "SIGKILL " + workers[v].name, start: since()}
				restarted, err := workers[v].kill(ctx)
				f.end, f.err = since(), err
				if err == nil {
					f.end = restarted.Sub(start)
					f.detail = "restarted after " + seconds(f.end-f.start)
				}
				add(f)
				logf("%s: %s (%s)", seconds(f.start), f.what, errOr(f.err, f.detail))
			}})
		}
	}
	if o.flushAt > 0 {
		actions = append(actions, action{o.flushAt, func() {
			f := chaosFault{kind: "flush", what: "Redis FLUSHALL", start: since()}
			var keys int64
			if n, err := rdb.DBSize(ctx).Result(); err == nil {
				keys = n
			}
			f.err = rdb.FlushAll(ctx).Err()
			f.end = since()
			f.detail = fmt.Sprintf("%d keys in db 0 before", keys)
			add(f)
			logf("%s: %s (%s)", seconds(f.start), f.what, errOr(f.err, f.detail))
		}})
	}
	if o.pgDownFor > 0 {
		var idx int
		actions = append(actions, action{o.pgDownAt, func() {
			cut := proxy.setDown(true)
			idx = add(chaosFault{kind: "postgres", what: fmt.Sprintf("Postgres unreachable for %s", o.pgDownFor), start: since(),
				detail: fmt.Sprintf("%d connections cut", cut)})
			logf("%s: Postgres down (%d connections cut)", seconds(since()), cut)
		}}, action{o.pgDownAt + o.pgDownFor, func() {
			proxy.setDown(false)
			mu.Lock()
			faults[idx].end = since()
			faults[idx].detail += fmt.Sprintf(", %d connection attempts refused", proxy.refusedCount())
			mu.Unlock()
			logf("%s: Postgres reachable again", seconds(since()))
		}})
	}
	slices.SortStableFunc(actions, func(a, b action) int { return int(a.at - b.at) })
	for _, a := range actions {
		if !sleepUntil(ctx, start.Add(a.at)) {
			break
		}
		a.do()
	}
	if ctx.Err() != nil {
		proxy.setDown(false)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.SortStableFunc(faults, func(a, b chaosFault) int { return int(a.start - b.start) })
	return faults
}

func errOr(err error, s string) string {
	if err != nil {
		return "error: " + err.Error()
	}
	return s
}

// chaosProgress prints a line every 2 s until stopped.
func chaosProgress(ctx context.Context, start time.Time, admin *pgxpool.Pool, accepted *atomic.Int64, n int,
	stats func() llmsim.Stats, logf func(string, ...any)) (stop func()) {
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			byStatus := "?"
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			if rows, err := admin.Query(qctx, `SELECT status, count(*) FROM jobs GROUP BY 1 ORDER BY 1`); err == nil {
				var parts []string
				for rows.Next() {
					var s string
					var c int
					if rows.Scan(&s, &c) == nil {
						parts = append(parts, fmt.Sprintf("%s %d", s, c))
					}
				}
				rows.Close()
				byStatus = strings.Join(parts, ", ")
			}
			cancel()
			st := stats()
			logf("  %5.1fs: accepted %d/%d; jobs: %s; provider: %d requests, %d 429s, %d in flight",
				time.Since(start).Seconds(), accepted.Load(), n, byStatus, st.Requests, st.ByStatus[429], st.InFlight)
		}
	}()
	return func() {
		select {
		case <-quit:
		default:
			close(quit)
		}
		<-exited
	}
}

// waitChaosJobs polls the database until every accepted job is terminal, or until graceAt,
// when the jobs still pending are recorded.
func waitChaosJobs(ctx context.Context, res *chaosResult, admin *pgxpool.Pool, submitsDone <-chan struct{}, graceAt time.Time,
	logf func(string, ...any)) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		done := false
		select {
		case <-submitsDone:
			done = true
		default:
		}
		now := time.Now()
		pending, err := chaosPending(ctx, admin, res.submits)
		switch {
		case err != nil:
			logf("  polling the database: %v", err)
		case done && len(pending) == 0:
			res.observedUntil, res.allTerminal = now.Sub(res.start), true
			return nil
		case now.After(graceAt):
			logf("%s: %d accepted jobs not terminal at the grace deadline", seconds(now.Sub(res.start)), len(pending))
			res.observedUntil, res.pending = now.Sub(res.start), pending
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interrupted: %w", context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// chaosPending returns the IDs of accepted jobs that are missing or not terminal.
func chaosPending(ctx context.Context, admin *pgxpool.Pool, submits []chaosSubmit) ([]string, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := admin.Query(qctx, `SELECT id::text, status FROM jobs`)
	if err != nil {
		return nil, err
	}
	status := map[string]string{}
	for rows.Next() {
		var id, s string
		if err := rows.Scan(&id, &s); err != nil {
			rows.Close()
			return nil, err
		}
		status[id] = s
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	var pending []string
	for _, s := range submits {
		if s.accepted && !terminal(status[s.id]) {
			pending = append(pending, s.id)
		}
	}
	return pending, nil
}

// chaosRow is one job row at the end of the run.
type chaosRow struct {
	id         string
	key        string
	status     string
	attempts   int
	hasResult  bool
	finishedAt *time.Time
	prompt     string
	recorded   int // rows in job_attempts
}

func chaosRows(ctx context.Context, admin *pgxpool.Pool) ([]chaosRow, error) {
	rows, err := admin.Query(ctx, `
SELECT j.id::text, coalesce(j.idempotency_key, ''), j.status, j.attempts, j.result IS NOT NULL, j.finished_at,
	coalesce(j.request->'messages'->0->>'content', ''), (SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id)
FROM jobs j ORDER BY j.id`)
	if err != nil {
		return nil, fmt.Errorf("read the jobs: %w", err)
	}
	defer rows.Close()
	var out []chaosRow
	for rows.Next() {
		var r chaosRow
		if err := rows.Scan(&r.id, &r.key, &r.status, &r.attempts, &r.hasResult, &r.finishedAt, &r.prompt, &r.recorded); err != nil {
			return nil, fmt.Errorf("read the jobs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the jobs: %w", err)
	}
	return out, nil
}
