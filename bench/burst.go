package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llmsim"
)

// A burst scenario (herd, outage, tokens) fires n jobs at once at each of its rows in turn:
// a client strategy, plain asynq or llmq, each against a fresh simulator.

// burstRow is one line of a burst table.
type burstRow struct {
	id, name string
	target   *target // nil: not judged
	// wrap, when set, sits between the row and its simulator.
	wrap func(http.Handler) http.Handler
	run  func(ctx context.Context, e *rowEnv) ([]outcome, error)
}

// burst is what every row of a burst scenario runs against.
type burst struct {
	*shared
	sim llmsim.Config
	// outage, when positive, makes the simulator answer 529 for that long from the row's first
	// submit; the requests it receives before the recovery are counted.
	outage time.Duration
	// body is job i's provider request; nil: a short Messages request.
	body func(i int) []byte
	// maxAttempts is the llmq rows' max_attempts; 0: 20.
	maxAttempts int
}

// rowEnv is what a row runs with: the scenario's burst, its own simulator and progress, and
// started, which the row calls just before its first submit.
type rowEnv struct {
	burst
	simURL   string
	apiKey   string
	progress *progress
	log      logf
	started  func()
}

// requestBody is the provider request of job i.
func (e *rowEnv) requestBody(i int) []byte {
	if e.body != nil {
		return e.body(i)
	}
	return messagesBody(i)
}

// jobMaxAttempts is the max_attempts an llmq row submits.
func (e *rowEnv) jobMaxAttempts() int {
	if e.maxAttempts > 0 {
		return e.maxAttempts
	}
	return 20
}

// messagesBody is job i's request: a small Anthropic Messages body.
func messagesBody(i int) []byte {
	return fmt.Appendf(nil, `{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"bench request %d"}]}`, i)
}

// outcome is what the benchmark saw of one job.
type outcome struct {
	// done: the job reached a final outcome (an answer, or its client gave up) before the row's
	// timeout.
	done bool
	// ok: the final outcome is a successful answer.
	ok bool
	// latency is submit → final outcome, as the client saw it.
	latency time.Duration
	// at is the final outcome's time since the row's first submit.
	at time.Duration
}

// result is one row's figures.
type result struct {
	id, name  string
	target    *target
	n         int
	succeeded int
	stats     llmsim.Stats // the simulator's counters
	p50, p95  time.Duration
	// last is the time of the last final outcome since the first submit; when !complete, the
	// row's timeout (some jobs had no outcome yet).
	last     time.Duration
	complete bool
	// during counts the provider requests received before the recovery (outage only).
	during int
	err    error // the row could not run; the figures are meaningless
}

func (r result) requests() int { return r.stats.Requests }

func (r result) answered(status int) int { return r.stats.ByStatus[status] }

// perSuccess is provider requests per succeeded job; ok is false when none succeeded.
func (r result) perSuccess() (float64, bool) {
	if r.succeeded == 0 {
		return 0, false
	}
	return float64(r.requests()) / float64(r.succeeded), true
}

// lastText is the last result's time, "> t" when the row timed out.
func (r result) lastText() string {
	if !r.complete {
		return "> " + seconds(r.last)
	}
	return seconds(r.last)
}

// summarize builds a row's figures from the outcomes of its jobs; timeout is the last result
// when some job had no final outcome.
func summarize(outs []outcome, timeout time.Duration) result {
	r := result{n: len(outs), complete: true}
	var lat []time.Duration
	for _, o := range outs {
		if !o.done {
			r.complete = false
			continue
		}
		r.last = max(r.last, o.at)
		if o.ok {
			r.succeeded++
			lat = append(lat, o.latency)
		}
	}
	if !r.complete {
		r.last = timeout
	}
	r.p50, r.p95 = percentile(lat, 50), percentile(lat, 95)
	return r
}

// selectRows keeps the rows named in -only, in table order.
func selectRows(rows []burstRow, only string) ([]burstRow, error) {
	keep, err := selectIDs(rowIDs(rows), only)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(rows, func(r burstRow) bool { return !slices.Contains(keep, r.id) }), nil
}

// rowIDs are the ids of rows, for -only's usage.
func rowIDs(rows []burstRow) []string {
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.id
	}
	return ids
}

// runRows runs rows one after the other, logging each, until ctx ends.
func (b burst) runRows(ctx context.Context, log logf, rows []burstRow) []result {
	var out []result
	for i, r := range rows {
		if ctx.Err() != nil {
			break
		}
		log("[%d/%d] %s: started", i+1, len(rows), r.name)
		res := b.runRow(ctx, log, r)
		if res.err != nil {
			log("[%d/%d] %s: error: %v", i+1, len(rows), r.name, res.err)
		} else {
			log("[%d/%d] %s: %d/%d succeeded, %d provider requests, %d 429s, last result %s", i+1, len(rows), r.name,
				res.succeeded, res.n, res.requests(), res.answered(http.StatusTooManyRequests), res.lastText())
		}
		out = append(out, res)
	}
	return out
}

// runRow runs r against a fresh simulator and summarizes it.
func (b burst) runRow(ctx context.Context, log logf, r burstRow) result {
	sim := llmsim.New(b.sim)
	var h http.Handler = sim
	if r.wrap != nil {
		h = r.wrap(h)
	}
	now := b.sim.Now // the simulator's clock: the outage's end is on it
	if now == nil {
		now = time.Now
	}
	counter := &arrivals{next: h, now: now}
	srv := httptest.NewServer(counter)
	defer srv.Close()
	e := &rowEnv{burst: b, simURL: srv.URL, apiKey: "sk-bench-" + randHex(8), progress: &progress{}, log: log}
	var startErr error
	e.started = func() {
		if b.outage > 0 {
			startErr = sim.SetFaults(llmsim.Faults{OverloadedFor: b.outage})
			counter.until(sim.Faults().OverloadedUntil)
		}
	}
	stop := e.progress.report(log, r.name, b.n, sim.Stats)
	outs, err := r.run(ctx, e)
	stop()
	if err == nil {
		err = startErr
	}
	if err != nil {
		return result{id: r.id, name: r.name, target: r.target, n: b.n, err: err}
	}
	res := summarize(outs, b.timeout)
	res.id, res.name, res.target, res.stats, res.during = r.id, r.name, r.target, sim.Stats(), counter.before()
	return res
}

// arrivals counts the provider requests that reach next before a deadline. Control requests
// (/_sim/...) are not counted. Safe for concurrent use.
type arrivals struct {
	next http.Handler
	now  func() time.Time

	mu       sync.Mutex
	deadline time.Time // zero: none yet, every request counts
	n        int
}

func (a *arrivals) until(t time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.deadline = t
}

func (a *arrivals) before() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

// ServeHTTP counts the request, when it is before the deadline, and passes it on.
func (a *arrivals) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.HasPrefix(r.URL.Path, "/_sim/") {
		at := a.now()
		a.mu.Lock()
		if a.deadline.IsZero() || at.Before(a.deadline) {
			a.n++
		}
		a.mu.Unlock()
	}
	a.next.ServeHTTP(w, r)
}
