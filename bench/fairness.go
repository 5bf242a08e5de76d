package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/tenant"
)

// fairness is `bench fairness`: the fairness scenarios against the simulator, through the whole
// system (the api and -workers worker processes sharing one credential), judged on the
// provider's log (which request of which tenant arrived when); each scenario also runs on plain
// asynq with three weighted queues, what a Go team would build instead.
type fairness struct {
	s     *shared
	dur   time.Duration
	which string // -scenarios: comma-separated scenario numbers to run (empty: all)
	// backlog is scenario 6's number of A's low jobs waiting (-backlog).
	backlog int
	// drainJobs is the drain comparison's backlog (-drain-jobs); baseBin holds the api and
	// worker built without lanes to compare with (-baseline-bin; empty: not compared).
	drainJobs int
	baseBin   string
	// drainPairs is how many drains of each build the comparison alternates (-drain-pairs).
	drainPairs int
	rows       []fairRow
}

// fairRow is one scenario's figures on one system.
type fairRow struct {
	name    string
	system  string
	unseen  int    // of the jobs the scenario waits for, those not served when its cap ended it
	waited  int    // the jobs the scenario waits for
	waitP50 string // B's (or the high jobs') wait, submit → provider
	waitP99 string
	share   string // the share per window (min-max) of the tenant or priority named
	n429    int
	rps     float64 // provider requests per second while there was work, against the limit
	rpsText string  // rps as shown, when not against the limit (the drain's jobs/s)
	target  string
	pass    bool
	err     error
	at429   []string // when each 429 came, from the first provider request
}

func (f *fairness) flags(fs *flagSet, s *shared) {
	f.s = s
	s.base(fs, 4)
	s.redis(fs)
	s.bucket(fs, 20, 10)
	s.deadline(fs, 3*time.Minute, "cap on each scenario and system")
	s.rows(fs, []string{"llmq", "asynq"})
	fs.DurationVar(&f.dur, "duration", 20*time.Second, "how long each scenario keeps the credential busy")
	fs.StringVar(&f.which, "scenarios", "", "comma-separated scenario numbers to run (default all): 1, 2, 3, 4, 6")
	fs.IntVar(&f.backlog, "backlog", 100_000, "scenario 6: A's low jobs waiting (queued with the workers stopped) when B starts (0: not run)")
	fs.IntVar(&f.drainJobs, "drain-jobs", 20_000, "scenario 6: the backlog A drains alone on an instant, unlimited provider (0: not run)")
	fs.IntVar(&f.drainPairs, "drain-pairs", 6, "scenario 6: drains of each build, in pairs whose order alternates (even: each build goes first as often); judged by the median of the pairs' ratios")
	fs.StringVar(&f.baseBin, "baseline-bin", "", "scenario 6: directory of an api and worker built without fair-queueing lanes, whose drain is compared (empty: none)")
	s.build = true // the binaries must hold the code measured
}

// arrival is one provider request: when, whose (tenant, priority, index), its status.
type arrival struct {
	at     time.Time
	tenant string
	prio   string
	i      int
	status int
}

var fairTag = regexp.MustCompile(`fair (\w+) (\w+) (\d+)`)

// providerLog records every request's arrival before the simulator answers it.
type providerLog struct {
	next http.Handler
	mu   sync.Mutex
	log  []arrival
}

func (p *providerLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	m := fairTag.FindSubmatch(body)
	if m == nil {
		p.next.ServeHTTP(w, r)
		return
	}
	i, _ := strconv.Atoi(string(m[3]))
	a := arrival{at: time.Now(), tenant: string(m[1]), prio: string(m[2]), i: i}
	sw := &statusWriter{ResponseWriter: w}
	p.next.ServeHTTP(sw, r)
	a.status = sw.status
	p.mu.Lock()
	p.log = append(p.log, a)
	p.mu.Unlock()
}

func (p *providerLog) snapshot() []arrival {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// fairEnv is one scenario's running system.
type fairEnv struct {
	f         *fairness
	send      sendFunc
	plog      *providerLog
	sim       *llmsim.Server
	log       logf
	submitted atomic.Int64
}

// sendFunc submits job i of tenant at prio, whose provider request is body, to the system.
type sendFunc func(ctx context.Context, tenantName, prio string, i int, body []byte) error

// fairSystem is a system the scenarios run on: start brings it up for tenants of the given
// weights against the simulator at simURL and returns how to submit to it and how to stop it.
type fairSystem struct {
	name  string
	start func(ctx context.Context, log logf, simURL string, weights map[string]int) (sendFunc, func(), error)
}

// fairBody is the provider request of job i of tenant at prio, tagged for the provider's log.
func fairBody(tenantName, prio string, i int) []byte {
	return fmt.Appendf(nil, `{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"fair %s %s %d"}]}`,
		tenantName, cmp.Or(prio, "default"), i)
}

// submit submits job i of tenant at prio and returns when it was submitted.
func (e *fairEnv) submit(ctx context.Context, tenantName, prio string, i int) (time.Time, error) {
	at := time.Now()
	if err := e.send(ctx, tenantName, prio, i, fairBody(tenantName, prio, i)); err != nil {
		return at, err
	}
	e.submitted.Add(1)
	return at, nil
}

// llmqSystem is the whole system: a fresh deployment, its api and -workers worker processes,
// the tenants created with their weights, jobs submitted over HTTP with their priority.
func (f *fairness) llmqSystem() fairSystem {
	return fairSystem{name: "llmq", start: func(ctx context.Context, log logf, simURL string, weights map[string]int) (sendFunc, func(), error) {
		r, err := f.startLLMQ(ctx, log, f.s.bin, simURL, &config.Limits{RequestsPerSecond: f.s.rate, Burst: int(f.s.capacity)}, weights)
		if err != nil {
			return nil, nil, err
		}
		return r.send, r.stop, nil
	}}
}

// llmqRun is a running llmq deployment of the fairness bench.
type llmqRun struct {
	st   *stack
	db   string // the deployment's database, for its backends' CPU
	send sendFunc
	stop func()
}

// startLLMQ deploys llmq from the binaries in bin against the simulator at simURL with the
// credential's limits, starts its api and -workers workers and creates the tenants (weights nil:
// the tenants named in names, with no weight column, as before tenants had weights).
func (f *fairness) startLLMQ(ctx context.Context, log logf, bin, simURL string, limits *config.Limits, weights map[string]int) (*llmqRun, error) {
	d, err := deploy(ctx, deployOpts{adminURL: f.s.dbURL, redisURL: f.s.redisURL, simURL: simURL,
		setup: llmqSetup{limits: limits}})
	if err != nil {
		return nil, err
	}
	st, err := startStack(ctx, d.stack(bin, f.s.redisURL), f.s.workers)
	if err != nil {
		d.close(f.s.keepLogs, log)
		return nil, err
	}
	stop := func() {
		st.stop()
		d.close(f.s.keepLogs, log)
	}
	log("api and %d workers ready", f.s.workers)
	var tokens map[string]string
	if bin == f.baseBin {
		tokens, err = createUnweightedTenants(ctx, d.dbURL, weights)
	} else {
		tokens, err = createTenants(ctx, d.dbURL, weights)
	}
	if err != nil {
		stop()
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	hc := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	send := func(ctx context.Context, tenantName, prio string, _ int, body []byte) error {
		return postTenantJob(ctx, hc, st.apiURL, tokens[tenantName], prio, body)
	}
	return &llmqRun{st: st, db: d.dbName, send: send, stop: func() { hc.CloseIdleConnections(); stop() }}, nil
}

// postTenantJob posts one job with its priority ("": none, the default) and provider request as
// the tenant of token; anything but a 202 is an error.
func postTenantJob(ctx context.Context, hc *http.Client, apiURL, token, prio string, request []byte) error {
	body := fmt.Appendf(nil, `{"max_attempts":20,"request":%s}`, request)
	if prio != "" {
		body = fmt.Appendf(nil, `{"priority":%q,"max_attempts":20,"request":%s}`, prio, request)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/v1/jobs", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("submit: %d %s", resp.StatusCode, b)
	}
	return nil
}

// submitMany posts n jobs of tenant at prio (indices from first), 32 at a time.
func (e *fairEnv) submitMany(ctx context.Context, tenantName, prio string, first, n int) (map[int]time.Time, error) {
	out := map[int]time.Time{}
	var mu sync.Mutex
	var firstErr error
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for i := first; i < first+n; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			at, err := e.submit(ctx, tenantName, prio, i)
			mu.Lock()
			defer mu.Unlock()
			out[i] = at
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	return out, firstErr
}

// scenario runs one scenario on a fresh system with tenants A and B of the given weights.
func (f *fairness) scenario(ctx context.Context, log logf, sys fairSystem, name string, wA, wB int,
	drive func(context.Context, *fairEnv) (fairRow, error)) fairRow {
	log = prefixed(log, name+", "+sys.name+": ")
	row, err := f.runScenario(ctx, log, sys, wA, wB, drive)
	if err != nil {
		log("error: %v", err)
		row = fairRow{err: err}
	}
	row.name, row.system = name, sys.name
	return row
}

func prefixed(log logf, prefix string) logf {
	return func(format string, args ...any) { log(prefix+format, args...) }
}

func (f *fairness) runScenario(ctx context.Context, log logf, sys fairSystem, wA, wB int,
	drive func(context.Context, *fairEnv) (fairRow, error)) (fairRow, error) {
	ctx, cancel := context.WithTimeout(ctx, f.s.timeout)
	defer cancel()
	sim := llmsim.New(llmsim.Config{Capacity: f.s.capacity, RefillPerSecond: f.s.rate})
	plog := &providerLog{next: sim}
	srv := httptest.NewServer(plog)
	defer srv.Close()
	send, stop, err := sys.start(ctx, log, srv.URL, map[string]int{"A": wA, "B": wB})
	if err != nil {
		return fairRow{}, err
	}
	defer stop()
	e := &fairEnv{f: f, send: send, plog: plog, sim: sim, log: log}
	row, err := drive(ctx, e)
	if err != nil {
		return fairRow{}, err
	}
	row.n429 = sim.Stats().ByStatus[http.StatusTooManyRequests]
	all := sortedByTime(plog.snapshot())
	jobs := int(e.submitted.Load())
	unserved := jobs - len(distinct(served(all)))
	for k, a := range all {
		if a.status == http.StatusTooManyRequests && len(row.at429) < 5 {
			row.at429 = append(row.at429, seconds(a.at.Sub(all[0].at)))
			log("429 at %s (request %d of %d, %s %s)", seconds(a.at.Sub(all[0].at)), k, len(all), a.tenant, a.prio)
		}
	}
	log("done (%d provider requests, %d 429s; %d of %d jobs not answered 2xx when it ended)", sim.Stats().Requests, row.n429, unserved, jobs)
	return row, nil
}

// served is the arrivals the provider answered 2xx: the requests that used the limit.
func served(log []arrival) []arrival {
	return slices.DeleteFunc(slices.Clone(log), func(a arrival) bool { return a.status/100 != 2 })
}

// distinct is the set of jobs (tenant, priority, index) among the arrivals.
func distinct(log []arrival) map[arrival]bool {
	out := map[arrival]bool{}
	for _, a := range log {
		out[arrival{tenant: a.tenant, prio: a.prio, i: a.i}] = true
	}
	return out
}

// createTenants creates the tenants with their weights (once the processes have migrated the
// database) and returns their bearer tokens.
func createTenants(ctx context.Context, dbURL string, weights map[string]int) (map[string]string, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	tokens := map[string]string{}
	store := tenant.NewStore(pool, nil)
	for name, w := range weights {
		_, tok, err := store.CreateWeighted(ctx, name, nil, w)
		if err != nil {
			return nil, err
		}
		tokens[name] = tok
	}
	return tokens, nil
}

// createUnweightedTenants creates the tenants named in weights as the schema before tenant
// weights stored them (the baseline binaries' database) and returns their bearer tokens.
func createUnweightedTenants(ctx context.Context, dbURL string, weights map[string]int) (map[string]string, error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	tokens := map[string]string{}
	for name := range weights {
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return nil, err
		}
		tok := tenant.BearerTokenPrefix + base64.RawURLEncoding.EncodeToString(raw)
		hash, err := tenant.HashBearerToken(tok)
		if err != nil {
			return nil, err
		}
		if _, err := pool.Exec(ctx, `INSERT INTO tenants (name, token_sha256) VALUES ($1, $2)`, name, hash[:]); err != nil {
			return nil, fmt.Errorf("create tenant %s: %w", name, err)
		}
		tokens[name] = tok
	}
	return tokens, nil
}

// shares returns the min and max, over windows of w from from to to, of the share of requests
// that match.
func shares(log []arrival, from, to time.Time, w time.Duration, match func(arrival) bool) (lo, hi float64) {
	lo, hi = 1, 0
	if w <= 0 {
		return lo, hi
	}
	for s := from; !s.Add(w).After(to); s = s.Add(w) {
		n, m := 0, 0
		for _, a := range log {
			if !a.at.Before(s) && a.at.Before(s.Add(w)) {
				n++
				if match(a) {
					m++
				}
			}
		}
		if n == 0 {
			continue
		}
		x := float64(m) / float64(n)
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

// busyRate is the rate beyond the burst: (requests - burst) per second between the first
// arrival and the last one before to. A provider bucket of burst b refilled at r/s serves at
// most b + r·t requests in t, so this is at most r however short the run, and at least 0.95 r
// when the limit is used to the full. burst below 1 counts as 1 (n-1 intervals between n
// arrivals).
func busyRate(log []arrival, to time.Time, burst float64) float64 {
	if len(log) < 2 {
		return 0
	}
	first, n := log[0].at, 0
	var last time.Time
	for _, a := range log {
		if a.at.Before(to) {
			n++
			last = a.at
		}
	}
	if !last.After(first) {
		return 0
	}
	return (float64(n) - max(burst, 1)) / last.Sub(first).Seconds()
}

func sortedByTime(log []arrival) []arrival {
	slices.SortFunc(log, func(a, b arrival) int { return a.at.Compare(b.at) })
	return log
}
