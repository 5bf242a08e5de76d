package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/operator"
)

// statusOrder lists every status in lifecycle order (the same rows as ctl stats).
var statusOrder = []jobs.Status{
	jobs.StatusQueued, jobs.StatusRunning, jobs.StatusRetrying,
	jobs.StatusSucceeded, jobs.StatusFailed, jobs.StatusDead, jobs.StatusCanceled,
}

// overviewWindow is the overview's window: the last hour, like ctl stats' default.
const overviewWindow = time.Hour

// Overview is the overview page's figures: those of `ctl stats` (the same queries) and the dead
// letters by reason.
type Overview struct {
	Window string `json:"window"`
	*jobs.Stats
	// Since hides Stats' Since, always absent: the window moves with each recomputation (a
	// start would make every live update look new), and Window says how long it is.
	Since *time.Time `json:"since,omitempty"`
	// Queue is the asynq queue's depth; nil when the console has no Tasks or Redis failed.
	Queue *dispatch.QueueDepth `json:"queue"`
	// DeadByReason counts every dead letter (of any age) by its reason.
	DeadByReason map[string]int `json:"dead_by_reason"`
}

// overviewTimings are how long each read of computeOverview took (for the Server-Timing header).
type overviewTimings struct{ stats, dead, queue time.Duration }

// header formats them as a Server-Timing header, which the browser shows the page's scripts.
func (t overviewTimings) header() string {
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) }
	return "stats;dur=" + ms(t.stats) + ", dead;dur=" + ms(t.dead) + ", queue;dur=" + ms(t.queue)
}

func (h *Handler) computeOverview(ctx context.Context) (*Overview, overviewTimings, error) {
	// The three reads are independent: run them at once (the first load waits for the slowest).
	var (
		wg                sync.WaitGroup
		st                *jobs.Stats
		dead              map[string]int
		depth             *dispatch.QueueDepth
		statsErr, deadErr error
		tm                overviewTimings
	)
	timed := func(d *time.Duration, f func()) {
		t0 := time.Now()
		f()
		*d = time.Since(t0)
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		timed(&tm.stats, func() { st, statsErr = h.cfg.Jobs.Stats(ctx, overviewWindow) })
	}()
	go func() {
		defer wg.Done()
		timed(&tm.dead, func() { dead, deadErr = h.cfg.Jobs.DeadByReason(ctx) })
	}()
	if h.cfg.Tasks != nil {
		timed(&tm.queue, func() {
			if d, err := h.cfg.Tasks.Depth(); err == nil {
				depth = &d
			} else {
				h.cfg.Logger.WarnContext(ctx, "console: queue depth", "error", err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(statsErr, deadErr); err != nil {
		return nil, tm, err
	}
	for _, s := range statusOrder {
		st.ByStatus[s] += 0 // every status present, zeros included
	}
	return &Overview{Window: overviewWindow.String(), Stats: st, Queue: depth, DeadByReason: dead}, tm, nil
}

func (h *Handler) overview(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	ov, tm, err := h.computeOverview(r.Context())
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	w.Header().Set("Server-Timing", tm.header())
	writeJSON(w, http.StatusOK, ov)
}

// overviewLive streams the overview as "overview" events: the latest figures at once (once
// there are any), then each time the process's shared recomputation (liveOverview) changes them.
// When a recomputation fails (Postgres does not answer), it sends one "overview_stale" event
// (staleOverview): the figures last sent are no longer live. The next recomputation that succeeds
// sends the figures again, changed or not. It ends with a "session_expired" event once its
// session has (see sessionEnded). It holds one of the process's event stream places while open
// (Config.OpenStream).
func (h *Handler) overviewLive(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	release, ok := h.openStream(w, r)
	if !ok {
		return
	}
	defer release()
	changed, unsubscribe := h.live.subscribe()
	defer unsubscribe()
	out, ok := startStream(w, h.cfg.EventWriteTimeout)
	if !ok {
		return
	}
	keep := time.NewTicker(h.cfg.KeepAlive)
	defer keep.Stop()
	var sent []byte
	sentStale := false
	for {
		if h.sessionEnded(r) {
			endStream(out)
			return
		}
		data, stale, asOf := h.live.latest()
		switch {
		case stale && !sentStale:
			if _, err := sendIfChanged(out, "overview_stale", staleOverview{AsOf: asOf}, nil); err != nil {
				return
			}
			sentStale = true
		case !stale && data != nil && (sentStale || !bytes.Equal(data, sent)):
			if _, err := fmt.Fprintf(out, "event: overview\ndata: %s\n\n", data); err != nil || out.flush() != nil {
				return
			}
			sent, sentStale = data, false
		}
		select {
		case <-r.Context().Done():
			return
		case <-h.closing:
			return
		case <-changed:
		case <-keep.C:
			if _, err := io.WriteString(out, ": keep-alive\n\n"); err != nil || out.flush() != nil {
				return
			}
		}
	}
}

// liveOverview recomputes the overview every LiveInterval (longer when a recomputation is slow:
// refreshWait) while at least one overview stream of the process is open, once for all of them: the
// cost of open consoles does not grow with their number. Its goroutine ends as soon as the last
// stream closes, or at Shutdown.
type liveOverview struct {
	h    *Handler
	wake chan struct{} // an unsubscribe pokes the loop, which ends without subscribers

	mu      sync.Mutex
	subs    map[chan struct{}]struct{}
	last    []byte    // the latest figures' JSON; nil before the first computation
	lastAt  time.Time // when they were computed (Config.Now)
	stale   bool      // the latest recomputation failed: last is not current
	running bool
}

// staleOverview is the data of an "overview_stale" event.
type staleOverview struct {
	// AsOf is when the figures last sent were computed (the API host's clock); absent when this
	// stream's process has computed none.
	AsOf *time.Time `json:"as_of,omitempty"`
}

func newLiveOverview(h *Handler) *liveOverview {
	return &liveOverview{h: h, wake: make(chan struct{}, 1), subs: map[chan struct{}]struct{}{}}
}

// subscribe registers a stream: its channel receives (coalesced) a signal when the figures
// change. cancel must be called; it is idempotent.
func (l *liveOverview) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	l.subs[ch] = struct{}{}
	if !l.running {
		l.running = true
		go l.run()
	}
	l.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			l.mu.Lock()
			delete(l.subs, ch)
			l.mu.Unlock()
			signal(l.wake)
		})
	}
}

// latest returns the latest figures' JSON (nil before the first computation), whether the
// latest recomputation failed, and when the figures were computed (nil: never).
func (l *liveOverview) latest() (data []byte, stale bool, asOf *time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last != nil {
		at := l.lastAt
		asOf = &at
	}
	return l.last, l.stale, asOf
}

// overviewCostRatio bounds the share of its time the live overview spends recomputing: the next
// recomputation waits at least this many times the last one's duration (and LiveInterval). The
// counts read the whole backlog (jobs.Store.Stats): 0.3-0.8 s for 50,000-200,000 waiting jobs,
// which at every LiveInterval kept a Postgres backend busy a third of the time per API process
// with an overview open; now at most a twentieth, and the figures come later on a large backlog.
const overviewCostRatio = 20

// refreshWait is how long the live overview waits after a recomputation that took took.
func refreshWait(interval, took time.Duration) time.Duration {
	return max(interval, overviewCostRatio*took)
}

func (l *liveOverview) run() {
	timer := time.NewTimer(l.compute())
	defer timer.Stop()
	for {
		due := false
		select {
		case <-l.h.closing:
		case <-timer.C:
			due = true
		case <-l.wake: // a stream left: end if it was the last
		}
		l.mu.Lock()
		if len(l.subs) == 0 || isClosed(l.h.closing) {
			// A later subscribe starts a new loop (and a first computation at once).
			l.running, l.last, l.lastAt, l.stale = false, nil, time.Time{}, false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		if due {
			timer.Reset(l.compute())
		}
	}
}

// compute recomputes the figures, signals the streams when they changed or the recomputation
// failed (or succeeded again after a failure), and returns how long to wait before the next
// recomputation (refreshWait, on the duration the clock Config.Now measured). It logs the first
// failure of an outage and the success that ends it, not every failure.
func (l *liveOverview) compute() time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), l.h.cfg.LiveInterval+5*time.Second)
	defer cancel()
	start := l.h.cfg.Now()
	ov, _, err := l.h.computeOverview(ctx)
	end := l.h.cfg.Now()
	wait := refreshWait(l.h.cfg.LiveInterval, end.Sub(start))
	var data []byte
	if err == nil {
		if data, err = json.Marshal(ov); err != nil {
			err = fmt.Errorf("encode overview: %w", err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		// Once per outage, not at every recomputation: the streams' stale mark says the rest.
		if !l.stale {
			l.h.cfg.Logger.WarnContext(ctx, "console: overview stream", "error", err)
			l.stale = true
			l.signalAll()
		}
		return wait
	}
	if l.stale {
		l.h.cfg.Logger.InfoContext(ctx, "console: overview live again")
	}
	changed := l.stale || !bytes.Equal(data, l.last)
	l.last, l.lastAt, l.stale = data, end, false
	if changed {
		l.signalAll()
	}
	return wait
}

// signalAll signals every stream; l.mu must be held.
func (l *liveOverview) signalAll() {
	for ch := range l.subs {
		signal(ch)
	}
}

// signal sends on ch unless a signal is pending already.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// streamWriter writes a Server-Sent Events stream and flushes it.
type streamWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // of each write (Config.EventWriteTimeout)
}

func (s *streamWriter) Write(p []byte) (int, error) {
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	return s.w.Write(p)
}

func (s *streamWriter) flush() error { return s.rc.Flush() }

// startStream sends the headers of an event stream. The server's read and write timeouts
// would end a stream that outlives them: each write gets its own deadline (writeTimeout) instead.
func startStream(w http.ResponseWriter, writeTimeout time.Duration) (*streamWriter, bool) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	// Operators' data, as the JSON answers (writeJSON): no cache keeps a copy.
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	s := &streamWriter{w: w, rc: rc, timeout: writeTimeout}
	return s, s.flush() == nil
}

// sendIfChanged sends v as event name unless its JSON equals last; it returns the JSON sent
// (or last).
func sendIfChanged(out *streamWriter, name string, v any, last []byte) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return last, fmt.Errorf("encode %s: %w", name, err)
	}
	if bytes.Equal(data, last) {
		return last, nil
	}
	if _, err := fmt.Fprintf(out, "event: %s\ndata: %s\n\n", name, data); err != nil {
		return last, err
	}
	return data, out.flush()
}
