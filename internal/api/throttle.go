package api

import (
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

// throttle lets one event per key through per interval and counts the others. It is safe for
// concurrent use.
type throttle struct {
	every time.Duration
	now   func() time.Time
	mu    sync.Mutex
	keys  map[string]*throttled
}

type throttled struct {
	last       time.Time
	suppressed int
}

func newThrottle(every time.Duration, now func() time.Time) *throttle {
	return &throttle{every: every, now: now, keys: map[string]*throttled{}}
}

// allow reports whether key's event may be logged now, and how many of its events were held
// back since the last one allowed.
func (t *throttle) allow(key string) (ok bool, suppressed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	k := t.keys[key]
	if k != nil && now.Sub(k.last) < t.every {
		k.suppressed++
		return false, 0
	}
	if k == nil {
		if len(t.keys) >= maxThrottleKeys {
			for name, v := range t.keys {
				if now.Sub(v.last) >= t.every {
					delete(t.keys, name)
				}
			}
		}
		k = &throttled{}
		t.keys[key] = k
	}
	suppressed, k.suppressed, k.last = k.suppressed, 0, now
	return true, suppressed
}
