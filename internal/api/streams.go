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

// errShuttingDown ends a stream cut by a shutdown mid-event.
var errShuttingDown = errors.New("the server is shutting down")

// writeChunk is the most a stream's write carries under one write deadline: a larger event (a
// result) goes in pieces, the deadline moved between them as for separate writes, so that the
// deadline bounds a wait without progress, not the whole event.
const writeChunk = 16 << 10

// deadlineWriter keeps a write deadline on a stream's connection, so that a client that stops
// reading is cut off, and the handler returns and frees the event it held, instead of blocking
// as long as the client keeps the connection: a piece of at most writeChunk bytes (a write, or
// the flush after it) that has not completed between timeout/2 and timeout after it began fails.
// A client that reads slowly but steadily (writeChunk bytes per timeout/2: 3.2 KB/s at 10s) gets
// every event, however large; one cut off mid-event had it again and again, and never got past
// it. The deadline is moved to timeout from now only by a piece that finds less than half of it
// left, not by every write: setting it costs a clock read and a timer's update, a noticeable
// share of an API replica's work per delta event and client.
type deadlineWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	now     func() time.Time
	// closing is Server.closing: a shutdown ends the stream between two pieces of an event.
	closing <-chan struct{}
	// until is the deadline set last (zero: none).
	until time.Time
}

func (d *deadlineWriter) Write(p []byte) (n int, err error) {
	for len(p) > 0 {
		piece := p[:min(len(p), writeChunk)]
		if n > 0 {
			select {
			case <-d.closing:
				return n, errShuttingDown
			default:
			}
		}
		if now := d.now(); d.until.Sub(now) < d.timeout/2 {
			d.until = now.Add(d.timeout)
			// ErrNotSupported: a writer without a connection (a test's recorder) cannot stall.
			if err := d.rc.SetWriteDeadline(d.until); err != nil && !errors.Is(err, http.ErrNotSupported) {
				return n, err
			}
		}
		m, err := d.w.Write(piece)
		n += m
		if err != nil {
			return n, err
		}
		p = p[len(piece):]
	}
	return n, nil
}
