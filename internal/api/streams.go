package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// streamRetryAfter is the Retry-After of a stream refused over its tenant's cap: streams last as
// long as their jobs, so any value is a guess; this one keeps a reconnecting client slow.
const streamRetryAfter = 5 * time.Second

// streamCounter caps each tenant's open event streams on this replica. It is safe for
// concurrent use.
type streamCounter struct {
	max   int
	mu    sync.Mutex
	count map[string]int
}

func newStreamCounter(max int) *streamCounter {
	return &streamCounter{max: max, count: map[string]int{}}
}

// open takes one of the tenant's stream places, or answers 429 with Retry-After when all are
// taken. Call release once when the stream ends.
func (c *streamCounter) open(tenant string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count[tenant] >= c.max {
		secs := strconv.Itoa(int(streamRetryAfter / time.Second))
		return nil, &httpError{status: http.StatusTooManyRequests, typ: "too_many_streams",
			message: fmt.Sprintf("tenant %q has %d event streams open on this server, its limit; retry after %s s", tenant, c.max, secs),
			header:  http.Header{"Retry-After": {secs}}}
	}
	c.count[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.count[tenant]--; c.count[tenant] == 0 {
				delete(c.count, tenant) // the map holds only tenants with a stream open
			}
		})
	}, nil
}

// deadlineWriter keeps a write deadline on a stream's connection, so that a client that stops
// reading is cut off, and the handler returns and frees the event it held, instead of blocking
// as long as the client keeps the connection: a write (or the flush after it) that has not
// completed between timeout/2 and timeout after it began fails. The deadline is moved to timeout
// from now only by a write that finds less than half of it left, not by every write: setting it
// costs a clock read and a timer's update, a noticeable share of an API replica's work per delta
// event and client.
type deadlineWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	// until is the deadline set last (zero: none).
	until time.Time
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	if now := time.Now(); d.until.Sub(now) < d.timeout/2 {
		d.until = now.Add(d.timeout)
		// ErrNotSupported: a writer without a connection (a test's recorder) cannot stall.
		if err := d.rc.SetWriteDeadline(d.until); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return 0, err
		}
	}
	return d.w.Write(p)
}
