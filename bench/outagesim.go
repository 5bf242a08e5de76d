package main

import (
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llmsim"
)

// simRecorder wraps the simulator's handler and notes every provider request: when it arrived
// relative to the outage's start, whether that was before the recovery instant, and the status
// it was answered with. Control requests (/_sim/...) pass through unrecorded. Safe for
// concurrent use.
type simRecorder struct {
	next http.Handler
	now  func() time.Time

	mu       sync.Mutex
	start    time.Time // zero until begin
	recovery time.Time // zero until begin
	reqs     []simRequest
}

// simRequest is one provider request the simulator received.
type simRequest struct {
	// at is the arrival since the outage's start; 0 for a request before it.
	at time.Duration
	// duringOutage: it arrived before the recovery instant (or before the outage was set up).
	duringOutage bool
	// status is the answer's status; llmsim.StatusClientClosed when the handler aborted.
	status int
}

func newSimRecorder(next http.Handler) *simRecorder {
	return &simRecorder{next: next, now: time.Now}
}

// begin records the outage's start and its recovery instant.
func (r *simRecorder) begin(start, recovery time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.start, r.recovery = start, recovery
}

// snapshot returns a copy of the requests so far and the recovery instant since the outage's
// start (0 before begin).
func (r *simRecorder) snapshot() ([]simRequest, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rec time.Duration
	if !r.start.IsZero() {
		rec = r.recovery.Sub(r.start)
	}
	return slices.Clone(r.reqs), rec
}

// ServeHTTP passes the request to the simulator and records it.
func (r *simRecorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if strings.HasPrefix(req.URL.Path, "/_sim/") {
		r.next.ServeHTTP(w, req)
		return
	}
	arrived := r.now()
	r.mu.Lock()
	q := simRequest{duringOutage: r.recovery.IsZero() || arrived.Before(r.recovery)}
	if !r.start.IsZero() {
		q.at = arrived.Sub(r.start)
	}
	r.mu.Unlock()
	sw := &statusWriter{ResponseWriter: w}
	returned := false
	defer func() {
		// Runs also when the simulator aborts the request (it panics with
		// http.ErrAbortHandler, which net/http handles); the panic goes on.
		switch {
		case !returned:
			q.status = llmsim.StatusClientClosed
		case sw.status == 0:
			q.status = http.StatusOK
		default:
			q.status = sw.status
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, q)
		r.mu.Unlock()
	}()
	r.next.ServeHTTP(sw, req)
	returned = true
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (the simulator flushes).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// timeline renders requests grouped by arrival interval of width step, each interval as
// "<start>: <count>×<status> ..." (statuses ascending), intervals in time order, separated by
// "; ". Intervals without requests are left out; "none" when there are no requests.
func timeline(reqs []simRequest, step time.Duration) string {
	if len(reqs) == 0 {
		return "none"
	}
	byStep := map[int64]map[int]int{}
	for _, q := range reqs {
		k := int64(q.at / step)
		if byStep[k] == nil {
			byStep[k] = map[int]int{}
		}
		byStep[k][q.status]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(byStep)) {
		var counts []string
		for _, st := range slices.Sorted(maps.Keys(byStep[k])) {
			counts = append(counts, fmt.Sprintf("%d×%d", byStep[k][st], st))
		}
		parts = append(parts, fmt.Sprintf("%s: %s", time.Duration(k)*step, strings.Join(counts, " ")))
	}
	return strings.Join(parts, "; ")
}

// outageArrivals lists the arrival times of the requests received during the outage ("0.012 s,
// 2.040 s, ..."), or only their count when there are more than limit.
func outageArrivals(reqs []simRequest, limit int) string {
	var at []string
	for _, q := range reqs {
		if q.duringOutage {
			at = append(at, fmt.Sprintf("%.3f s", q.at.Seconds()))
		}
	}
	switch {
	case len(at) == 0:
		return "none"
	case len(at) > limit:
		return fmt.Sprintf("%d requests", len(at))
	}
	return strings.Join(at, ", ")
}

// outageSplit divides the requests received during the outage into the opening burst (those
// that arrived less than one cooldown after the first of them: a breaker cannot let a probe
// through before it has opened and cooled down) and the probes (the rest). span is the time
// from the first request of the burst to its last.
func outageSplit(reqs []simRequest, cooldown time.Duration) (burst, probes int, span time.Duration) {
	var during []time.Duration
	for _, q := range reqs {
		if q.duringOutage {
			during = append(during, q.at)
		}
	}
	if len(during) == 0 {
		return 0, 0, 0
	}
	slices.Sort(during)
	for _, at := range during {
		if at-during[0] < cooldown {
			burst++
			span = at - during[0]
		} else {
			probes++
		}
	}
	return burst, probes, span
}

// minOutageRequests is the fewest provider requests a breaker that opens after exactly
// threshold failures and then probes once per cooldown sends during an outage of length
// outage starting at its first request: the threshold, plus a probe at every whole cooldown
// before the outage ends.
func minOutageRequests(threshold int, outage, cooldown time.Duration) int {
	return minOutageProbing(threshold, outage, cooldown, cooldown)
}

// minOutageProbing is minOutageRequests for a breaker whose first cooldown is cooldown and every
// later one maxCooldown (the backoff at its cap): the threshold, plus a probe at cooldown,
// cooldown + maxCooldown, … strictly before the outage ends.
func minOutageProbing(threshold int, outage, cooldown, maxCooldown time.Duration) int {
	if cooldown >= outage {
		return threshold
	}
	return threshold + 1 + int((outage-1-cooldown)/maxCooldown)
}
