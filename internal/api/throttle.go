package api

import (
	"log/slog"
	"sync"
	"time"
)

// authLogInterval is how often a tenant's refused credential may be logged.
const authLogInterval = time.Minute

// streamLogInterval is how often a failure of the event streams (a watch renewal, a read) may be
// logged, all streams together (see Server.streamLog).
const streamLogInterval = 10 * time.Second

// maxThrottleKeys bounds a throttle's memory: past it, keys whose interval has passed are
// dropped (their next line is logged anyway).
const maxThrottleKeys = 10_000

// throttle lets one event per key through per interval and counts the others. With report set
// (trailing), the events held back after the last one let through are not left for the next
// one, which may never come (the last failures of an outage): report is called with their count
// once the interval after the last let through has passed, unless one was let through meanwhile
// (its count is then the line's), with the details of the last one held back (allow's attrs):
// a report that said only how many left an operator nothing to look for; and at the highest
// level among those held back (allowAt's level): a report was a warning, the internal errors
// it counted too. It is safe for concurrent use.
type throttle struct {
	every time.Duration
	now   func() time.Time
	// report, when set, is called with the events of a key held back and never counted in an
	// allowed one, an interval after the last allowed (its own goroutine, no lock held), the
	// highest level among them, and the attrs that allow was given with the last of them.
	report func(key string, level slog.Level, suppressed int, last []any)
	// afterFunc runs f after d, as time.AfterFunc does (tests).
	afterFunc func(d time.Duration, f func()) (stop func() bool)
	mu        sync.Mutex
	keys      map[string]*throttled
	// pending is the reports scheduled (report): stopped by stop.
	pending map[*throttled]func() bool
	stopped bool
}

type throttled struct {
	last       time.Time
	suppressed int
	// held is the attrs of the last event held back since the last allowed (nil when none).
	held []any
	// level is the highest level among the events held back since the last allowed.
	level slog.Level
}

func newThrottle(every time.Duration, now func() time.Time) *throttle {
	return &throttle{every: every, now: now, keys: map[string]*throttled{}, pending: map[*throttled]func() bool{},
		afterFunc: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }}
}

// allow is allowAt for an event logged as a warning.
func (t *throttle) allow(key string, attrs ...any) (ok bool, suppressed int) {
	return t.allowAt(key, slog.LevelWarn, attrs...)
}

// allowAt reports whether key's event, logged at level, may be logged now, and how many of its
// events were held back since the last one allowed. attrs describe the event (slog's key-value
// pairs): those of the last one held back go to its report, at the highest level held back.
func (t *throttle) allowAt(key string, level slog.Level, attrs ...any) (ok bool, suppressed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	k := t.keys[key]
	if k != nil && now.Sub(k.last) < t.every {
		if k.suppressed == 0 || level > k.level {
			k.level = level
		}
		k.suppressed++
		k.held = attrs
		t.scheduleLocked(key, k, k.last.Add(t.every).Sub(now))
		return false, 0
	}
	if k == nil {
		if len(t.keys) >= maxThrottleKeys {
			for name, v := range t.keys {
				if now.Sub(v.last) >= t.every && t.pending[v] == nil {
					delete(t.keys, name)
				}
			}
		}
		k = &throttled{}
		t.keys[key] = k
	}
	suppressed, k.suppressed, k.last, k.held = k.suppressed, 0, now, nil
	return true, suppressed
}

// scheduleLocked schedules the report of key's held-back events in d, unless one is.
func (t *throttle) scheduleLocked(key string, k *throttled, d time.Duration) {
	if t.report == nil || t.stopped || t.pending[k] != nil {
		return
	}
	t.pending[k] = t.afterFunc(d, func() { t.flush(key, k) })
}

// flush reports key's held-back events, counted as a line allowed now, once the interval after
// the last allowed has passed.
func (t *throttle) flush(key string, k *throttled) {
	t.mu.Lock()
	delete(t.pending, k)
	if left := k.last.Add(t.every).Sub(t.now()); left > 0 && k.suppressed > 0 {
		// Early by the throttle's clock (a line allowed meanwhile, or a clock of its own).
		t.scheduleLocked(key, k, left)
		t.mu.Unlock()
		return
	}
	n, held, level := k.suppressed, k.held, k.level
	if n > 0 && !t.stopped {
		k.suppressed, k.last, k.held = 0, t.now(), nil
	}
	stopped := t.stopped
	t.mu.Unlock()
	if n > 0 && !stopped {
		t.report(key, level, n, held)
	}
}

// stop cancels the reports scheduled, and schedules none after: the server is shutting down.
func (t *throttle) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	for k, stop := range t.pending {
		stop()
		delete(t.pending, k)
	}
}
