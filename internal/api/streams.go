package api

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/httpserve"
)

// streamRetryAfter is the Retry-After of a stream refused over its tenant's cap or the server's:
// streams last as long as their jobs, so any value is a guess; this one keeps a reconnecting
// client slow.
const streamRetryAfter = 5 * time.Second

// Reasons a stream is refused, the label values of llmq_event_streams_rejected_total.
const (
	// streamsRejectedServer: the replica holds MaxStreams streams (503 overloaded).
	streamsRejectedServer = "server"
	// streamsRejectedTenant: the tenant holds MaxStreamsPerTenant streams (429 too_many_streams).
	streamsRejectedTenant = "tenant"
)

// defaultMaxStreams is Config.MaxStreams's default for a server of maxConnections connections
// (0: httpserve.DefaultMaxConnections): half of them, so that a replica whose every stream place
// is taken still has as many connections for submits, polls, cancels and health checks.
func defaultMaxStreams(maxConnections int) int {
	if maxConnections <= 0 {
		maxConnections = httpserve.DefaultMaxConnections()
	}
	return max(1, maxConnections/2)
}

// streamCounter caps the open event streams of this replica, all together (a stream holds a
// connection, a goroutine and its buffers for as long as its job runs) and each tenant's. It is
// safe for concurrent use.
type streamCounter struct {
	max, maxPerTenant int
	metrics           *Metrics
	mu                sync.Mutex
	total             int
	count             map[string]int
}

func newStreamCounter(max, maxPerTenant int, metrics *Metrics) *streamCounter {
	return &streamCounter{max: max, maxPerTenant: maxPerTenant, metrics: metrics, count: map[string]int{}}
}

// openServer takes one of the replica's stream places, or answers 503 overloaded with
// Retry-After when all are taken: before the stream reads anything, so that a flood of streams
// over the cap costs Postgres nothing. Call release once when the stream ends.
func (c *streamCounter) openServer() (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.total >= c.max {
		c.metrics.streamRejected(streamsRejectedServer)
		secs := strconv.Itoa(int(streamRetryAfter / time.Second))
		return nil, &httpError{status: http.StatusServiceUnavailable, typ: "overloaded",
			message: fmt.Sprintf("this server has %d event streams open, its limit; retry after %s s", c.max, secs),
			header:  http.Header{"Retry-After": {secs}}}
	}
	c.total++
	c.metrics.streamsOpen(c.total)
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.total--
			c.metrics.streamsOpen(c.total)
		})
	}, nil
}

// openConsole takes one of the replica's stream places for a live page of the console
// (console.Config.OpenStream): the console's streams hold connections as the API's do, and so
// count in MaxStreams (and llmq_event_streams_open, llmq_event_streams_rejected_total{reason=
// "server"}) with them; not in any tenant's.
func (c *streamCounter) openConsole() (release func(), retryAfter time.Duration, ok bool) {
	release, err := c.openServer()
	return release, streamRetryAfter, err == nil
}

// open takes one of the tenant's stream places, or answers 429 with Retry-After when all are
// taken. Call release once when the stream ends.
func (c *streamCounter) open(tenant string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.count[tenant] >= c.maxPerTenant {
		c.metrics.streamRejected(streamsRejectedTenant)
		secs := strconv.Itoa(int(streamRetryAfter / time.Second))
		return nil, &httpError{status: http.StatusTooManyRequests, typ: "too_many_streams",
			message: fmt.Sprintf("tenant %q has %d event streams open on this server, its limit; retry after %s s", tenant, c.maxPerTenant, secs),
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
