package main

import (
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
