// Package logthrottle keeps a repeated log line from flooding the log: per key, one event is let
// through per interval and the others are counted, their count going with the key's next line,
// or with a trailing report of its own once the interval has passed (the last events of a flood,
// which no line may ever follow). Its memory is bounded by the keys seen within an interval.
package logthrottle

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultMaxKeys is Config.MaxKeys's default.
const DefaultMaxKeys = 10_000

// ReportFunc reports key's events held back and never counted in a line let through: suppressed
// of them (at least one), the highest level among them (AllowAt's), and the attrs that the last
// of them was given (Allow's). It is called from a goroutine of its own, no lock held.
type ReportFunc func(key string, level slog.Level, suppressed int, last []any)

// TimerFunc runs f in its own goroutine after d, as time.AfterFunc does, and returns what stops
// it (Timer.Stop).
type TimerFunc func(d time.Duration, f func()) (stop func() bool)

// Config configures a Throttle.
type Config struct {
	// Every is the interval: one event per key is let through per Every. Required (above zero).
	Every time.Duration
	// Now is the clock the interval is measured on. Default time.Now.
	Now func() time.Time
	// Report, when set, is called with the events of a key held back and never counted in a
	// line let through, once Every has passed since the key's last line (see Throttle). nil:
	// their count goes with the key's next line only.
	Report ReportFunc
	// MaxKeys bounds the keys kept: past it, a new key drops the keys whose interval has passed
	// and whose report is not pending (their next event would be let through anyway; without a
	// Report, the count they held back is lost). Default DefaultMaxKeys.
	MaxKeys int
	// AfterFunc schedules the reports. Default time.AfterFunc (tests: reports run when told).
	AfterFunc TimerFunc
}

// Throttle lets one event per key through per interval (Config.Every) and counts the others.
// With a Report (trailing), the events held back after the last one let through are not left
// for the next one, which may never come (the last failures of an outage): Report is called with
// their count once the interval after the last let through has passed, unless one was let
// through meanwhile (its count is then the line's), with the attrs of the last one held back (a
// report that said only how many left an operator nothing to look for), at the highest level
// among those held back (a report was a warning, the errors it counted too). A report counts as
// a line let through: the interval starts again from it. With a Report, every event is counted
// exactly once, in a line or in a report, until Stop.
//
// Memory: a key is kept for at least an interval after its last line, and while its report is
// pending; past Config.MaxKeys, a new key drops those that are neither, so that the keys kept
// exceed MaxKeys only by those seen within the last interval. It is safe for concurrent use.
type Throttle struct {
	every   time.Duration
	now     func() time.Time
	report  ReportFunc
	maxKeys int
	mu      sync.Mutex
	// afterFunc is Config.AfterFunc (SetAfterFunc).
	afterFunc TimerFunc
	keys      map[string]*throttled
	// pending is the reports scheduled (Report): stopped by Stop.
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

// New returns a Throttle. It panics when cfg is nil or cfg.Every is not above zero (a
// programmer's error).
func New(cfg *Config) *Throttle {
	if cfg == nil || cfg.Every <= 0 {
		panic("logthrottle: Config.Every must be above zero")
	}
	t := &Throttle{every: cfg.Every, now: cfg.Now, report: cfg.Report, maxKeys: cfg.MaxKeys,
		afterFunc: cfg.AfterFunc, keys: map[string]*throttled{},
		pending: map[*throttled]func() bool{}}
	if t.now == nil {
		t.now = time.Now
	}
	if t.maxKeys <= 0 {
		t.maxKeys = DefaultMaxKeys
	}
	if t.afterFunc == nil {
		t.afterFunc = func(d time.Duration, f func()) func() bool {
			return time.AfterFunc(d, f).Stop
		}
	}
	return t
}

// SetAfterFunc replaces the function that schedules reports (Config.AfterFunc), for the reports
// scheduled from now on: a test that did not build the Throttle runs them when it says. It is
// safe for concurrent use.
func (t *Throttle) SetAfterFunc(f TimerFunc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.afterFunc = f
}

// Allow is AllowAt for an event logged as a warning.
func (t *Throttle) Allow(key string, attrs ...any) (ok bool, suppressed int) {
	return t.AllowAt(key, slog.LevelWarn, attrs...)
}

// AllowAt reports whether key's event, logged at level, may be logged now, and how many of key's
// events were held back since the last one let through (or reported): the line's to say. attrs
// describe the event (slog's key-value pairs): those of the last one held back go to its report,
// at the highest level held back. The caller must not change attrs after the call.
func (t *Throttle) AllowAt(key string, level slog.Level, attrs ...any) (ok bool, suppressed int) {
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
		if len(t.keys) >= t.maxKeys {
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
func (t *Throttle) scheduleLocked(key string, k *throttled, d time.Duration) {
	if t.report == nil || t.stopped || t.pending[k] != nil {
		return
	}
	t.pending[k] = t.afterFunc(d, func() { t.flush(key, k) })
}

// flush reports key's held-back events, counted as a line allowed now, once the interval after
// the last allowed has passed.
func (t *Throttle) flush(key string, k *throttled) {
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

// Stop cancels the reports scheduled, and schedules none after (its owner is shutting down):
// what is held back from then on is counted in the key's next line only. A report already
// running may still finish. It is idempotent and safe for concurrent use.
func (t *Throttle) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	for k, stop := range t.pending {
		stop()
		delete(t.pending, k)
	}
}
