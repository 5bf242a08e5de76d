package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/llmsim"
)

// instructionsBench is `bench instructions`: the instructions one job costs the queue's own
// process, counted by valgrind's callgrind (repeatable within a few percent whatever else the
// shared machine is doing, where CPU seconds drift by tens of percent), for `llmq serve` (the
// API and a worker in one process) and for the floor over HTTP as a process of its own. Each
// runs under callgrind against an instant simulator in this process; after a warm-up, each round
// counts an idle window (the pollers' instructions per second) and a window in which -n jobs
// are submitted and finish, and a job's cost is the busy window's count less the idle rate over
// its length, divided by -n. Postgres, Redis, the simulator and the clients are not counted.
type instructionsBench struct {
	s        *shared
	idle     time.Duration
	rounds   int
	clients  int
	valgrind string
	// keys sends each job with an Idempotency-Key of its own (the submit fingerprints the body).
	keys bool
	rows []instrRow
}

// instrRow is one system's measurement: each of its processes' rounds.
type instrRow struct {
	name  string
	procs []instrProc
	err   error
}

// instrProc is one process's rounds.
type instrProc struct {
	name   string
	rounds []instrRound
}

// instrRound is one process's round: an idle window and a busy one.
type instrRound struct{ idle, busy instrWindow }

// instrWindow is the instructions counted between a zeroing and a dump, and the seconds between.
type instrWindow struct {
	instr uint64
	secs  float64
}

// perJob is the round's instructions per job of n: the busy window less the idle rate over its
// length.
func (r instrRound) perJob(n int) float64 {
	rate := float64(r.idle.instr) / r.idle.secs
	return (float64(r.busy.instr) - rate*r.busy.secs) / float64(n)
}

// instrIDs are the systems -only selects from.
var instrIDs = []string{"serve", "llmq", "httpfloor"}

// instrGodebug keeps Go programs runnable under valgrind 3.19: without rdtscp (which VEX does not
// decode: SIGILL in runtime.cputicks) and without asynchronous preemption (its signals trip an
// assertion in callgrind's signal handling).
const instrGodebug = "GODEBUG=cpu.rdtscp=off,asyncpreemptoff=1"

// httpFloorRow names the floor's row, which the others are divided by.
const httpFloorRow = "floor over HTTP: POST → insert → asynq → provider → update"

func (b *instructionsBench) flags(fs *flagSet, s *shared) {
	s.base(fs, 1)
	s.redis(fs)
	s.jobs(fs, 200, "jobs of each busy window")
	s.deadline(fs, 5*time.Minute, "cap on each window's wait for its jobs (and on a start under valgrind)")
	fs.positiveDuration(&b.idle, "idle", 5*time.Second, "length of each idle window")
	fs.intAtLeast(&b.rounds, "rounds", 3, 1, "rounds (an idle window, then a busy one) per system")
	fs.intAtLeast(&b.clients, "clients", 4, 1, "concurrent submitting clients")
	fs.StringVar(&b.valgrind, "valgrind", "valgrind", "valgrind binary (callgrind_control is looked for beside it)")
	fs.BoolVar(&b.keys, "keys", false, "send each llmq job with an Idempotency-Key of its own")
	s.rows(fs, instrIDs)
	b.s = s
}

func (b *instructionsBench) run(ctx context.Context, log logf) error {
	ids, err := selectIDs(instrIDs, b.s.only)
	if err != nil {
		return err
	}
	if err := b.s.binaries(ctx, log); err != nil {
		return err
	}
	vg, err := exec.LookPath(b.valgrind)
	if err != nil {
		return fmt.Errorf("valgrind: %w", err)
	}
	control := filepath.Join(filepath.Dir(vg), "callgrind_control")
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the bench binary: %w", err)
	}
	sim := httptest.NewServer(llmsim.New(llmsim.Config{}))
	defer sim.Close()
	hc := providerClient(b.clients)
	defer hc.CloseIdleConnections()
	for _, t := range []struct {
		id, name string
		start    func(context.Context, string) (*instrTarget, error)
	}{
		{"serve", "llmq serve: API and worker in one process", func(ctx context.Context, dir string) (*instrTarget, error) {
			return b.startLLMQ(ctx, vg, dir, sim.URL, true)
		}},
		{"llmq", "llmq api and worker processes", func(ctx context.Context, dir string) (*instrTarget, error) {
			return b.startLLMQ(ctx, vg, dir, sim.URL, false)
		}},
		{"httpfloor", httpFloorRow, func(ctx context.Context, dir string) (*instrTarget, error) {
			return b.startFloor(ctx, vg, self, dir, sim.URL)
		}},
	} {
		if !slices.Contains(ids, t.id) {
			continue
		}
		log("%s under callgrind: %d rounds of %s idle and %d jobs", t.name, b.rounds, b.idle, b.s.n)
		row := instrRow{name: t.name}
		row.procs, row.err = b.measure(ctx, control, hc, t.start, log)
		if row.err != nil {
			log("  %v", row.err)
		}
		b.rows = append(b.rows, row)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// instrTarget is a system running under callgrind.
type instrTarget struct {
	procs  []*proc // each counted on its own
	outDir string  // where callgrind writes cg.<pid>.<n>
	url    string  // the system's API
	// submit posts job i; unfinished counts the jobs not yet finished.
	submit     func(ctx context.Context, hc *http.Client, i int) error
	unfinished func(ctx context.Context) (int, error)
	c          cleanups
}

// measure starts a system, warms it up and counts its rounds.
func (b *instructionsBench) measure(ctx context.Context, control string, hc *http.Client,
	start func(context.Context, string) (*instrTarget, error), log logf) ([]instrProc, error) {
	dir, err := os.MkdirTemp("", "llmq-bench-instr-")
	if err != nil {
		return nil, fmt.Errorf("create temp dir: %w", err)
	}
	defer func() {
		if b.s.keepLogs {
			log("  callgrind's dumps and the process's log kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	t, err := start(ctx, dir)
	if t != nil {
		defer t.c.run()
	}
	if err != nil {
		return nil, err
	}
	if err := b.ready(ctx, t); err != nil {
		return nil, err
	}
	next := 0
	batch := func(n int) error {
		first := next
		next += n
		return b.jobs(ctx, hc, t, first, n)
	}
	// A warm-up as large as a round: the pools (Postgres, Redis, the provider's connections) grow
	// to what a round needs before anything is counted.
	if err := batch(b.s.n); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	procs := make([]instrProc, len(t.procs))
	for i, p := range t.procs {
		procs[i].name = p.name
	}
	for range b.rounds {
		idle, err := b.window(ctx, control, t, func() error {
			if !sleepUntil(ctx, time.Now().Add(b.idle)) {
				return ctx.Err()
			}
			return nil
		})
		if err != nil {
			return procs, fmt.Errorf("idle window: %w", err)
		}
		busy, err := b.window(ctx, control, t, func() error { return batch(b.s.n) })
		if err != nil {
			return procs, fmt.Errorf("busy window: %w", err)
		}
		for i := range procs {
			procs[i].rounds = append(procs[i].rounds, instrRound{idle: idle[i], busy: busy[i]})
		}
	}
	return procs, nil
}

// kill ends a process under callgrind: a signal Go's runtime handles (SIGTERM) trips callgrind's
// signal assertion, so there is no graceful stop; the counts were dumped already. An asynq server
// of the process leaves its entries in asynq's lists of servers and workers (their keys expire,
// the list entries do not), which rdb removes.
func kill(p *proc, rdb redis.UniversalClient) {
	_ = p.cmd.Process.Kill()
	<-p.done
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	mark := fmt.Sprintf(":%d:", p.pid())
	for _, list := range []string{"asynq:servers", "asynq:workers"} {
		members, err := rdb.ZRange(ctx, list, 0, -1).Result()
		if err != nil {
			continue
		}
		for _, m := range members {
			if strings.Contains(m, mark) {
				rdb.ZRem(ctx, list, m)
				rdb.Unlink(ctx, m)
			}
		}
	}
}

// ready waits for the system's /healthz (a start under valgrind takes seconds).
func (b *instructionsBench) ready(ctx context.Context, t *instrTarget) error {
	ctx, cancel := context.WithTimeout(ctx, b.s.timeout)
	defer cancel()
	for {
		if err := t.exited(); err != nil {
			return err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.url+"/healthz", nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return fmt.Errorf("%s not ready: %w", t.url, ctx.Err())
		}
	}
}

// jobs submits jobs first..first+n-1 from the clients and waits until none is unfinished.
func (b *instructionsBench) jobs(ctx context.Context, hc *http.Client, t *instrTarget, first, n int) error {
	ctx, cancel := context.WithTimeout(ctx, b.s.timeout)
	defer cancel()
	next := make(chan int)
	errs := make([]error, b.clients)
	var wg sync.WaitGroup
	for c := range b.clients {
		wg.Go(func() {
			for i := range next {
				if err := t.submit(ctx, hc, i); err != nil && errs[c] == nil {
					errs[c] = err
				}
			}
		})
	}
	for i := first; i < first+n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for {
		left, err := t.unfinished(ctx)
		if err != nil {
			return err
		}
		if left == 0 {
			return nil
		}
		if err := t.exited(); err != nil {
			return err
		}
		if !sleepUntil(ctx, time.Now().Add(20*time.Millisecond)) {
			return fmt.Errorf("%d of %d jobs unfinished: %w", left, n, ctx.Err())
		}
	}
}

// window zeroes the processes' counts, runs work, dumps them and reads the dumps (one window per
// process, in t.procs' order).
func (b *instructionsBench) window(ctx context.Context, control string, t *instrTarget, work func() error) ([]instrWindow, error) {
	each := func(cmd string) error {
		for _, p := range t.procs {
			if out, err := exec.CommandContext(ctx, control, cmd, strconv.Itoa(p.pid())).CombinedOutput(); err != nil {
				return fmt.Errorf("callgrind_control %s %s: %w: %s", cmd, p.name, err, out)
			}
		}
		return nil
	}
	if err := each("-z"); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := work(); err != nil {
		return nil, err
	}
	if err := each("-d"); err != nil {
		return nil, err
	}
	secs := time.Since(start).Seconds()
	out := make([]instrWindow, len(t.procs))
	for i, p := range t.procs {
		n, err := latestDumpTotal(t.outDir, p.pid())
		if err != nil {
			return nil, err
		}
		out[i] = instrWindow{instr: n, secs: secs}
	}
	return out, nil
}

// exited returns the first of the processes' early exits.
func (t *instrTarget) exited() error {
	for _, p := range t.procs {
		if err := p.exited(); err != nil {
			return err
		}
	}
	return nil
}

// latestDumpTotal reads the total instruction count of the newest callgrind dump of pid in dir
// (files cg.<pid>.<n>, n counting the dumps).
func latestDumpTotal(dir string, pid int) (uint64, error) {
	prefix := fmt.Sprintf("cg.%d.", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("read callgrind dumps: %w", err)
	}
	best, bestN := "", 0
	for _, e := range entries {
		k, ok := strings.CutPrefix(e.Name(), prefix)
		if n, err := strconv.Atoi(k); ok && err == nil && n > bestN {
			best, bestN = e.Name(), n
		}
	}
	if best == "" {
		return 0, fmt.Errorf("no callgrind dump of pid %d in %s", pid, dir)
	}
	f, err := os.Open(filepath.Join(dir, best))
	if err != nil {
		return 0, fmt.Errorf("open callgrind dump: %w", err)
	}
	defer f.Close()
	return dumpTotal(bufio.NewScanner(f))
}

// dumpTotal reads a callgrind dump's "totals:" line (or its "summary:" line).
func dumpTotal(sc *bufio.Scanner) (uint64, error) {
	var summary string
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "totals:"); ok {
			return strconv.ParseUint(strings.Fields(v)[0], 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "summary:"); ok {
			summary = v
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read callgrind dump: %w", err)
	}
	if f := strings.Fields(summary); len(f) > 0 {
		return strconv.ParseUint(f[0], 10, 64)
	}
	return 0, errors.New("callgrind dump without totals")
}

// callgrindArgs is valgrind's command line running argv under callgrind, its dumps in dir.
func callgrindArgs(dir string, argv ...string) []string {
	return append([]string{"--tool=callgrind", "--callgrind-out-file=" + filepath.Join(dir, "cg.%p")}, argv...)
}

// startLLMQ deploys llmq (its database, queue and config) and starts it under callgrind: `llmq
// serve` when serve is set, else an api process and, once it answers, a worker process.
func (b *instructionsBench) startLLMQ(ctx context.Context, vg, dir, simURL string, serve bool) (*instrTarget, error) {
	d, err := deploy(ctx, deployOpts{adminURL: b.s.dbURL, redisURL: b.s.redisURL, simURL: simURL})
	if err != nil {
		return nil, err
	}
	t := &instrTarget{outDir: dir}
	t.c.add(func() { d.close(false, nil) })
	obs, err := pgxpool.New(ctx, d.dbURL)
	if err != nil {
		return t, fmt.Errorf("open observer pool: %w", err)
	}
	t.c.add(obs.Close)
	addr, err := freeAddr()
	if err != nil {
		return t, err
	}
	t.url = "http://" + addr
	_, rdb, err := redisFor(ctx, b.s.redisURL)
	if err != nil {
		return t, err
	}
	t.c.add(func() { rdb.Close() })
	env := childEnv(os.Environ(), []string{simKeyEnv + "=" + d.apiKey, instrGodebug})
	start := func(name, binary string, args ...string) error {
		p, err := startProc(vg, name, dir, env, callgrindArgs(dir, append([]string{filepath.Join(b.s.bin, binary)}, args...)...)...)
		if err != nil {
			return err
		}
		t.procs = append(t.procs, p)
		t.c.add(func() { kill(p, rdb) })
		return nil
	}
	keyPrefix := ""
	if b.keys {
		keyPrefix = fmt.Sprintf("instr-%d-", time.Now().UnixNano()) // no key of an earlier run's
	}
	var keyed atomic.Int64 // a job's number is not unique across rounds
	t.submit = func(ctx context.Context, hc *http.Client, i int) error {
		key := ""
		if keyPrefix != "" {
			key = keyPrefix + strconv.FormatInt(keyed.Add(1), 10)
		}
		_, err := submitKeyedJob(ctx, hc, t.url, i, jobBody(messagesBody(i), llmqMaxAttempts, llmqJobTimeout), key)
		return err
	}
	t.unfinished = func(ctx context.Context) (int, error) {
		return countRows(ctx, obs, `SELECT count(*) FROM jobs WHERE status IN ('queued', 'running', 'retrying')`)
	}
	if serve {
		return t, start("llmq-serve", "llmq", "serve", "--config", d.cfgPath, "--listen", addr)
	}
	if err := start("api", "api", "--config", d.cfgPath, "--listen", addr); err != nil {
		return t, err
	}
	if err := b.ready(ctx, t); err != nil { // the api migrates the database the worker needs
		return t, err
	}
	return t, start("worker", "worker", "--config", d.cfgPath)
}

// startFloor makes the floor's database and queue and starts its process (the bench binary's
// httpfloor-serve) under callgrind.
func (b *instructionsBench) startFloor(ctx context.Context, vg, self, dir, simURL string) (*instrTarget, error) {
	t := &instrTarget{outDir: dir}
	name := "llmq_bench_instr_" + randHex(6)
	pool, err := openBenchPool(ctx, &t.c, b.s.dbURL, name, 2)
	if err != nil {
		return t, err
	}
	if _, err := pool.Exec(ctx, benchJobsDDL); err != nil {
		return t, fmt.Errorf("create bench_jobs: %w", err)
	}
	_, rdb, err := redisFor(ctx, b.s.redisURL)
	if err != nil {
		return t, err
	}
	t.c.add(func() { rdb.Close() })
	queue := "bench-instr-floor-" + randHex(6)
	t.c.add(func() { cleanQueue(rdb, queue) })
	addr, err := freeAddr()
	if err != nil {
		return t, err
	}
	cfg := floorProcConfig{dbURL: pool.Config().ConnString(), redisURL: b.s.redisURL, queue: queue, simURL: simURL,
		listen: addr, conns: 16, concurrency: 200}
	env := childEnv(os.Environ(), []string{instrGodebug})
	p, err := startProc(vg, "httpfloor", dir, env, callgrindArgs(dir, append([]string{self}, cfg.args()...)...)...)
	if err != nil {
		return t, err
	}
	t.procs, t.url = []*proc{p}, "http://"+addr
	t.c.add(func() { kill(p, rdb) })
	t.submit = func(ctx context.Context, hc *http.Client, i int) error {
		body, err := json.Marshal(httpFloorJob{I: i, Request: messagesBody(i)})
		if err != nil {
			return err
		}
		return postBenchJob(ctx, hc, t.url, i, body)
	}
	t.unfinished = func(ctx context.Context) (int, error) {
		return countRows(ctx, pool, `SELECT count(*) FROM bench_jobs WHERE status = 'queued'`)
	}
	return t, nil
}

// countRows runs a count query.
func countRows(ctx context.Context, pool *pgxpool.Pool, query string) (int, error) {
	var n int
	if err := pool.QueryRow(ctx, query).Scan(&n); err != nil {
		return 0, fmt.Errorf("count unfinished jobs: %w", err)
	}
	return n, nil
}

func (b *instructionsBench) report() report {
	t := table{header: []string{"system (its processes, under callgrind)", "jobs per round", "instructions per job, each round",
		"median", "idle: instructions per second", "÷ floor over HTTP"}}
	type line struct {
		name       string
		per, idle  []float64 // per round
		err        error
		systemLine bool
	}
	var lines []line
	for _, r := range b.rows {
		total := line{name: r.name, err: r.err, systemLine: true}
		var parts []line
		for _, p := range r.procs {
			l := line{name: "· " + p.name}
			for k, rd := range p.rounds {
				l.per = append(l.per, rd.perJob(b.s.n))
				l.idle = append(l.idle, float64(rd.idle.instr)/rd.idle.secs)
				if k == len(total.per) {
					total.per, total.idle = append(total.per, 0), append(total.idle, 0)
				}
				total.per[k] += l.per[k]
				total.idle[k] += l.idle[k]
			}
			parts = append(parts, l)
		}
		lines = append(lines, total)
		if len(parts) > 1 {
			lines = append(lines, parts...)
		}
	}
	var floor float64
	for _, l := range lines {
		if l.systemLine && l.name == httpFloorRow && len(l.per) > 0 {
			floor = median(l.per)
		}
	}
	for _, l := range lines {
		cells := make([]string, len(l.per))
		for k, v := range l.per {
			cells[k] = millions(v)
		}
		row := []string{l.name, strconv.Itoa(b.s.n), strings.Join(cells, ", "), "–", "–", ""}
		if len(l.per) > 0 {
			m := median(l.per)
			row[3], row[4] = millions(m), millions(median(l.idle))+" /s"
			if floor > 0 && l.systemLine {
				row[5] = fmt.Sprintf("%.2f", m/floor)
			}
		}
		if l.err != nil {
			row[2] = "not measured: " + firstLine(l.err)
		}
		t.rows = append(t.rows, row)
	}
	var failed []string
	for _, r := range b.rows {
		if r.err != nil {
			failed = append(failed, r.name)
		}
	}
	return report{tables: []table{t}, failed: failed, notes: []string{
		fmt.Sprintf("Each system runs alone under valgrind's callgrind (%s), against an instant simulator in the bench's process; a warm-up of %d jobs, then %d rounds of an idle window (%s) and a busy one (%d jobs from %d clients, until all finished), counts zeroed and dumped with callgrind_control around each window. A job's instructions: the busy window's less the idle window's rate over the busy window's length, divided by the jobs; a system of several processes is their sum, each shown below it. Only the queues' own processes are counted (llmq serve: the API and a worker; the floor: its API and asynq handler), not Postgres, Redis, the simulator or the clients.",
			instrGodebug, b.s.n, b.rounds, b.idle, b.s.n, b.clients),
		"Instruction counts do not drift with the machine's load as CPU seconds do; what moves them is the work: the idle subtraction assumes the pollers run at their idle rate during the busy window, and a process under valgrind runs some 50 times slower, so time-driven work (polls, heartbeats, tickers) weighs more than at full speed.",
	}}
}

// millions renders an instruction count in millions: "1.23 M".
func millions(v float64) string { return fmt.Sprintf("%.2f M", v/1e6) }
