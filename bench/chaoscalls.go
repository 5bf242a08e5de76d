package main

import (
	"bytes"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llmsim"
)

// chaosCallLog wraps the simulator's handler and logs every provider request that carries a
// job marker (see chaosMarker): which job, when it arrived, when its answer ended and with which
// status. The simulator sees only the request body, so the marker in the prompt is the only way
// to tell which job a request belongs to. Control requests (/_sim/...) pass through unlogged.
// Safe for concurrent use.
type chaosCallLog struct {
	next   http.Handler
	now    func() time.Time
	marker *regexp.Regexp

	mu       sync.Mutex
	calls    []chaosCall
	unmarked int // provider requests without a marker of this run
}

// chaosCall is one provider request of a job.
type chaosCall struct {
	job     int       // the job's index (from its marker)
	arrived time.Time // when the simulator received it
	ended   time.Time // when its answer was written, or the client went away
	// status is the answer's status; llmsim.StatusClientClosed when the client went away
	// before the answer (a killed worker, a canceled attempt).
	status int
}

// chaosMarker is the text that identifies job i of run tag in its prompt.
func chaosMarker(tag string, i int) string { return "llmq-chaos-" + tag + "-job-" + strconv.Itoa(i) }

// chaosBody is the provider request of job i of run tag: a short Anthropic Messages request whose
// prompt is the job's marker.
func chaosBody(tag string, i int) []byte {
	return []byte(`{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"` + chaosMarker(tag, i) + `"}]}`)
}

// newChaosCallLog logs the requests that carry a marker of run tag.
func newChaosCallLog(next http.Handler, tag string) *chaosCallLog {
	return &chaosCallLog{next: next, now: time.Now,
		marker: regexp.MustCompile(`llmq-chaos-` + regexp.QuoteMeta(tag) + `-job-([0-9]+)\b`)}
}

// ServeHTTP logs the request when it carries a marker and passes it to the simulator unchanged.
func (l *chaosCallLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/_sim/") {
		l.next.ServeHTTP(w, r)
		return
	}
	arrived := l.now()
	body, err := io.ReadAll(r.Body)
	if err != nil {
		// The client went away while sending: the simulator never saw a request.
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	job := -1
	if m := l.marker.FindSubmatch(body); m != nil {
		if n, err := strconv.Atoi(string(m[1])); err == nil {
			job = n
		}
	}
	sw := &statusWriter{ResponseWriter: w}
	returned := false
	defer func() {
		// Runs also when the simulator aborts the request (http.ErrAbortHandler); the panic
		// goes on to net/http.
		c := chaosCall{job: job, arrived: arrived, ended: l.now()}
		switch {
		case !returned:
			c.status = llmsim.StatusClientClosed
		case sw.status == 0:
			c.status = http.StatusOK
		default:
			c.status = sw.status
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if job < 0 {
			l.unmarked++
			return
		}
		l.calls = append(l.calls, c)
	}()
	l.next.ServeHTTP(sw, r)
	returned = true
}

// snapshot returns a copy of the calls so far, in arrival order, and the count of provider
// requests without a marker.
func (l *chaosCallLog) snapshot() ([]chaosCall, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.calls)
	slices.SortStableFunc(out, func(a, b chaosCall) int { return a.arrived.Compare(b.arrived) })
	return out, l.unmarked
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
