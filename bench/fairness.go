package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/tenant"
)

// fairness is `bench fairness`: issue 19's scenarios against the simulator, through the whole
// system (the api and -workers worker processes sharing one credential), judged on the
// provider's log (which request of which tenant arrived when). llmq only: the comparison with
// asynq's weighted queues is not built yet.
type fairness struct {
	s    *shared
	dur  time.Duration
	rows []fairRow
}

// fairRow is one scenario's figures.
type fairRow struct {
	name    string
	waitP50 string // B's (or the high jobs') wait, submit → provider
	waitP99 string
	share   string // the share per window (min-max) of the tenant or priority named
	n429    int
	rps     float64 // provider requests per second while there was work, against the limit
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
	s.deadline(fs, 3*time.Minute, "cap on each scenario")
	fs.DurationVar(&f.dur, "duration", 20*time.Second, "how long each scenario keeps the credential busy")
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
	f      *fairness
	apiURL string
	tokens map[string]string
	hc     *http.Client
	plog   *providerLog
	sim    *llmsim.Server
	log    logf
}

// submit posts job i of tenant at prio and returns when it was submitted.
func (e *fairEnv) submit(ctx context.Context, tenantName, prio string, i int) (time.Time, error) {
	body := fmt.Sprintf(`{"priority":%q,"max_attempts":20,"request":{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"fair %s %s %d"}]}}`,
		prio, tenantName, prio, i)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.apiURL+"/v1/jobs", bytes.NewReader([]byte(body)))
	if err != nil {
		return time.Time{}, err
	}
	req.Header.Set("Authorization", "Bearer "+e.tokens[tenantName])
	at := time.Now()
	resp, err := e.hc.Do(req)
	if err != nil {
		return at, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return at, fmt.Errorf("submit: %d %s", resp.StatusCode, b)
	}
	return at, nil
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

// scenario runs one scenario on a fresh deployment with tenants A and B of the given weights.
func (f *fairness) scenario(ctx context.Context, log logf, name string, wA, wB int,
	drive func(context.Context, *fairEnv) (fairRow, error)) fairRow {
	row, err := f.runScenario(ctx, log, name, wA, wB, drive)
	if err != nil {
		log("%s: error: %v", name, err)
		return fairRow{name: name, err: err}
	}
	row.name = name
	return row
}

func (f *fairness) runScenario(ctx context.Context, log logf, name string, wA, wB int,
	drive func(context.Context, *fairEnv) (fairRow, error)) (fairRow, error) {
	ctx, cancel := context.WithTimeout(ctx, f.s.timeout)
	defer cancel()
	sim := llmsim.New(llmsim.Config{Capacity: f.s.capacity, RefillPerSecond: f.s.rate})
	plog := &providerLog{next: sim}
	srv := httptest.NewServer(plog)
	defer srv.Close()
	d, err := deploy(ctx, deployOpts{adminURL: f.s.dbURL, redisURL: f.s.redisURL, simURL: srv.URL,
		setup: llmqSetup{limits: &config.Limits{RequestsPerSecond: f.s.rate, Burst: int(f.s.capacity)}}})
	if err != nil {
		return fairRow{}, err
	}
	defer func() { d.close(f.s.keepLogs, log) }()
	st, err := startStack(ctx, d.stack(f.s.bin, f.s.redisURL), f.s.workers)
	if err != nil {
		return fairRow{}, err
	}
	defer st.stop()
	log("%s: api and %d workers ready", name, f.s.workers)
	tokens, err := createTenants(ctx, d.dbURL, map[string]int{"A": wA, "B": wB})
	if err != nil {
		return fairRow{}, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	e := &fairEnv{f: f, apiURL: st.apiURL, tokens: tokens, hc: &http.Client{Transport: tr, Timeout: 30 * time.Second},
		plog: plog, sim: sim, log: log}
	defer e.hc.CloseIdleConnections()
	row, err := drive(ctx, e)
	if err != nil {
		return fairRow{}, err
	}
	row.n429 = sim.Stats().ByStatus[http.StatusTooManyRequests]
	if row.n429 > 0 {
		all := sortedByTime(plog.snapshot())
		for k, a := range all {
			if a.status == http.StatusTooManyRequests {
				log("%s: 429 at %s (request %d of %d, %s %s)", name, seconds(a.at.Sub(all[0].at)), k, len(all), a.tenant, a.prio)
				row.at429 = append(row.at429, seconds(a.at.Sub(all[0].at)))
			}
		}
	}
	log("%s: done (%d provider requests, %d 429s)", name, sim.Stats().Requests, row.n429)
	return row, nil
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

// waitArrivals waits until the provider has seen n tagged requests, or ctx ends.
func (e *fairEnv) waitArrivals(ctx context.Context, n int) []arrival {
	for {
		a := e.plog.snapshot()
		if len(a) >= n || ctx.Err() != nil {
			return a
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// shares returns the min and max, over windows of w from from to to, of the share of requests
// that match.
func shares(log []arrival, from, to time.Time, w time.Duration, match func(arrival) bool) (lo, hi float64) {
	lo, hi = 1, 0
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

// busyRate is requests per second between the first arrival and the last one before to.
func busyRate(log []arrival, to time.Time) float64 {
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
	return float64(n-1) / last.Sub(first).Seconds()
}

func sortedByTime(log []arrival) []arrival {
	slices.SortFunc(log, func(a, b arrival) int { return a.at.Compare(b.at) })
	return log
}
