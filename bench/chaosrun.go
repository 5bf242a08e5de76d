package main

import (
	"context"
	"errors"
	"fmt"
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
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
)

// chaosSystem is the system a chaos run attacks: a private Redis, Postgres behind a proxy
// that can cut it off, the simulator with its call log, and the api and worker processes under
// supervisors.
type chaosSystem struct {
	tag      string // marks this run's prompts
	redisURL string
	rdb      redis.UniversalClient
	proxy    *pgProxy
	d        *deployment
	admin    *pgxpool.Pool // the database, directly
	sim      *llmsim.Server
	calls    *chaosCallLog
	apiURLs  []string
	apis     []*chaosSlot
	workers  []*chaosSlot
	c        cleanups
	keep     bool // keep the config and logs
}

// start brings the system up. On error, what was started is stopped.
func (c *chaos) start(ctx context.Context, log logf) (*chaosSystem, error) {
	sys := &chaosSystem{tag: randHex(4)}
	if err := c.bringUp(ctx, sys, log); err != nil {
		sys.keep = ctx.Err() == nil
		sys.close()
		return nil, err
	}
	log("private redis at %s, postgres through proxy %s, %d apis and %d workers ready", sys.redisURL, sys.proxy.addr(), c.apis, c.s.workers)
	return sys, nil
}

func (c *chaos) bringUp(ctx context.Context, sys *chaosSystem, log logf) error {
	redisURL, stopRedis, err := startPrivateRedis(ctx, c.redisServer)
	if err != nil {
		return err
	}
	sys.c.add(stopRedis)
	sys.redisURL = redisURL
	if _, sys.rdb, err = redisFor(ctx, redisURL); err != nil {
		return err
	}
	sys.c.add(func() { sys.rdb.Close() })
	pgTarget, err := pgHostPort(c.s.dbURL)
	if err != nil {
		return err
	}
	if sys.proxy, err = startPGProxy(pgTarget); err != nil {
		return err
	}
	sys.c.add(sys.proxy.close)

	sys.sim = llmsim.New(llmsim.Config{Capacity: c.s.capacity, RefillPerSecond: c.s.rate, Latency: c.latency,
		LatencyJitter: c.jitter, Rand: rand.New(rand.NewPCG(c.s.seed, 0x73696d)).Float64})
	sys.calls = newChaosCallLog(sys.sim, sys.tag)
	simSrv := httptest.NewServer(sys.calls)
	sys.c.add(simSrv.Close)

	sys.d, err = deploy(ctx, deployOpts{adminURL: c.s.dbURL, redisURL: redisURL, dbHost: sys.proxy.addr(), simURL: simSrv.URL,
		setup: llmqSetup{limits: &config.Limits{RequestsPerSecond: c.s.rate, Burst: int(c.s.capacity)}}})
	if err != nil {
		return err
	}
	sys.c.add(func() { sys.d.close(sys.keep, log) })
	if sys.admin, err = pgxpool.New(ctx, sys.d.dbURL); err != nil {
		return fmt.Errorf("connect to the run's database: %w", err)
	}
	sys.c.add(sys.admin.Close)
	return c.startProcesses(ctx, sys)
}

// startProcesses starts the api and worker processes, each under its supervisor, and waits
// until they are ready.
func (c *chaos) startProcesses(ctx context.Context, sys *chaosSystem) error {
	d := sys.d
	env := childEnv(os.Environ(), []string{simKeyEnv + "=" + d.apiKey})
	for i := range c.apis {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		sys.apiURLs = append(sys.apiURLs, "http://"+addr)
		sys.apis = append(sys.apis, newChaosSlot(fmt.Sprintf("api-%d", i+1), filepath.Join(c.s.bin, "api"), d.dir, env,
			"--config", d.cfgPath, "--listen", addr))
	}
	for i := range c.s.workers {
		sys.workers = append(sys.workers, newChaosSlot(fmt.Sprintf("worker-%d", i+1), filepath.Join(c.s.bin, "worker"), d.dir, env,
			"--config", d.cfgPath))
	}
	slots := sys.slots()
	sys.c.add(func() { stopSlots(slots) })
	// The api and workers migrate the new database at start-up under an advisory lock; start
	// one api first so the others find it migrated.
	slots[0].start()
	if err := waitReady(ctx, sys.redisURL, d.queue, sys.apiURLs[:1], nil, slotExit(slots[:1])); err != nil {
		return err
	}
	for _, s := range slots[1:] {
		s.start()
	}
	return waitReady(ctx, sys.redisURL, d.queue, sys.apiURLs, sys.workerPIDs, slotExit(slots))
}

func (sys *chaosSystem) slots() []*chaosSlot { return append(slices.Clone(sys.apis), sys.workers...) }

func (sys *chaosSystem) workerPIDs() []int {
	pids := make([]int, len(sys.workers))
	for i, w := range sys.workers {
		pids[i] = w.pid()
	}
	return pids
}

// slotExit reports the first process of slots that ended on its own.
func slotExit(slots []*chaosSlot) func() error {
	return func() error {
		for _, s := range slots {
			if exits := s.unexpectedExits(); len(exits) > 0 {
				e := exits[0]
				return fmt.Errorf("%s exited at start-up (%v); end of its log:\n%s", e.name, e.err, e.tail)
			}
		}
		return nil
	}
}

// close stops and removes everything; the config and logs are kept with keep.
func (sys *chaosSystem) close() { sys.c.run() }

// drive submits the jobs and injects the faults, waits for the jobs, and collects what
// happened.
func (c *chaos) drive(ctx context.Context, sys *chaosSystem, log logf) (chaosResult, error) {
	res := chaosResult{tag: sys.tag, start: time.Now()}
	subs := c.submitAll(ctx, sys, res.start)
	defer subs.stop()
	stop := every(2*time.Second, func(d time.Duration) {
		st := sys.sim.Stats()
		log("  %5.1fs: accepted %d/%d; jobs: %s; provider: %d requests, %d 429s, %d in flight",
			d.Seconds(), len(subs.acceptedIDs()), c.s.n, jobsByStatus(ctx, sys.admin), st.Requests, st.ByStatus[429], st.InFlight)
	})
	defer stop()
	res.faults = c.inject(ctx, sys, res.start, log)
	if err := context.Cause(ctx); err != nil {
		return res, fmt.Errorf("interrupted: %w", err)
	}
	for _, f := range res.faults {
		res.lastFaultEnd = max(res.lastFaultEnd, f.end)
	}
	log("faults over at %s; every accepted job must be terminal by %s", seconds(res.lastFaultEnd), seconds(res.lastFaultEnd+c.grace))
	if err := waitChaosJobs(ctx, &res, sys.admin, subs, res.start.Add(res.lastFaultEnd+c.grace), log); err != nil {
		return res, err
	}
	stop()
	subs.stop()
	res.submits = subs.all
	res.calls, res.unmarked = sys.calls.snapshot()
	var err error
	if res.rows, err = chaosRows(ctx, sys.admin); err != nil {
		return res, err
	}
	slots := sys.slots()
	stopSlots(slots)
	for _, s := range slots {
		res.exits = append(res.exits, s.unexpectedExits()...)
	}
	return res, nil
}

// chaosSubmits are the submits of a run in progress. all is complete once done is closed.
type chaosSubmits struct {
	mu     sync.Mutex
	all    []chaosSubmit
	done   chan struct{}
	cancel context.CancelFunc
}

// submitAll submits job i at i·submitOver/(n−1) from start, each retried on its own. However
// the run ends, no submit outlives stop.
func (c *chaos) submitAll(ctx context.Context, sys *chaosSystem, start time.Time) *chaosSubmits {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	client := &chaosClient{hc: hc, apiURLs: sys.apiURLs, start: start, rand: lockedRand(c.s.seed)}
	ctx, cancel := context.WithCancel(ctx)
	subs := &chaosSubmits{all: make([]chaosSubmit, c.s.n), done: make(chan struct{}), cancel: cancel}
	var wg sync.WaitGroup
	for i := range c.s.n {
		wg.Go(func() {
			key := fmt.Sprintf("chaos-%s-%d", sys.tag, i)
			at := time.Duration(0)
			if c.s.n > 1 {
				at = c.submitOver * time.Duration(i) / time.Duration(c.s.n-1)
			}
			sub := chaosSubmit{key: key, giveUp: "interrupted"}
			if sleepUntil(ctx, start.Add(at)) {
				sub = client.submit(ctx, i, key, chaosBody(sys.tag, i), c.maxAttempts)
			}
			subs.mu.Lock()
			defer subs.mu.Unlock()
			subs.all[i] = sub
		})
	}
	go func() {
		wg.Wait()
		hc.CloseIdleConnections()
		close(subs.done)
	}()
	return subs
}

// acceptedIDs are the IDs of the jobs accepted so far.
func (s *chaosSubmits) acceptedIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for _, sub := range s.all {
		if sub.accepted {
			ids = append(ids, sub.id)
		}
	}
	return ids
}

// finished reports whether every submit has ended.
func (s *chaosSubmits) finished() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// stop ends the submits still trying and waits for them.
func (s *chaosSubmits) stop() {
	s.cancel()
	<-s.done
}

// jobsByStatus counts the jobs by status, for the progress lines ("?" when unreadable).
func jobsByStatus(ctx context.Context, admin *pgxpool.Pool) string {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	rows, err := admin.Query(ctx, `SELECT status, count(*) FROM jobs GROUP BY 1 ORDER BY 1`)
	if err != nil {
		return "?"
	}
	defer rows.Close()
	var parts []string
	for rows.Next() {
		var s string
		var n int
		if rows.Scan(&s, &n) == nil {
			parts = append(parts, fmt.Sprintf("%s %d", s, n))
		}
	}
	return strings.Join(parts, ", ")
}

// waitChaosJobs polls the database until every accepted job is terminal, or until graceAt,
// when the jobs still pending are recorded.
func waitChaosJobs(ctx context.Context, res *chaosResult, admin *pgxpool.Pool, subs *chaosSubmits, graceAt time.Time, log logf) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		done := subs.finished()
		now := time.Now()
		pending, err := chaosPending(ctx, admin, subs.acceptedIDs())
		switch {
		case err != nil:
			log("  polling the database: %v", err)
		case done && len(pending) == 0:
			res.observedUntil, res.allTerminal = now.Sub(res.start), true
			return nil
		case now.After(graceAt):
			log("%s: %d accepted jobs not terminal at the grace deadline", seconds(now.Sub(res.start)), len(pending))
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

// chaosPending returns the IDs of accepted that are missing or not terminal.
func chaosPending(ctx context.Context, admin *pgxpool.Pool, accepted []string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	rows, err := admin.Query(ctx, `SELECT id::text, status FROM jobs`)
	if err != nil {
		return nil, fmt.Errorf("read job statuses: %w", err)
	}
	defer rows.Close()
	status := map[string]string{}
	for rows.Next() {
		var id, s string
		if err := rows.Scan(&id, &s); err != nil {
			return nil, fmt.Errorf("read job statuses: %w", err)
		}
		status[id] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read job statuses: %w", err)
	}
	var pending []string
	for _, id := range accepted {
		if !terminal(status[id]) {
			pending = append(pending, id)
		}
	}
	return pending, nil
}

// chaosRow is one job row at the end of the run.
type chaosRow struct {
	id         string
	key        string
	status     string
	hasResult  bool
	finishedAt *time.Time
	prompt     string
	recorded   int // rows in job_attempts
}

// chaosRows reads every job row.
func chaosRows(ctx context.Context, admin *pgxpool.Pool) ([]chaosRow, error) {
	rows, err := admin.Query(ctx, `
SELECT j.id::text, coalesce(j.idempotency_key, ''), j.status, j.result IS NOT NULL, j.finished_at,
	coalesce(j.request->'messages'->0->>'content', ''), (SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id)
FROM jobs j ORDER BY j.id`)
	if err != nil {
		return nil, fmt.Errorf("read the jobs: %w", err)
	}
	defer rows.Close()
	var out []chaosRow
	for rows.Next() {
		var r chaosRow
		if err := rows.Scan(&r.id, &r.key, &r.status, &r.hasResult, &r.finishedAt, &r.prompt, &r.recorded); err != nil {
			return nil, fmt.Errorf("read the jobs: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the jobs: %w", err)
	}
	return out, nil
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

// sleepUntil waits until t; false when ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	tm := time.NewTimer(time.Until(t))
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}
