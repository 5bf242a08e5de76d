package httpserve

import (
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// MaxDefaultConnections caps DefaultMaxConnections.
const MaxDefaultConnections = 10_000

// DefaultMaxConnections is the connection cap when none is configured: three quarters of the
// process's open-file limit (the rest is left for Postgres, Redis and the process's own files),
// at most MaxDefaultConnections. Past the limit accept fails for everyone; under the cap the
// API answers the connections it has and refuses new ones with a 503.
func DefaultMaxConnections() int {
	n := OpenFileLimit()
	if n <= 0 {
		return MaxDefaultConnections
	}
	return max(1, min(MaxDefaultConnections, n*3/4))
}

// OpenFileLimit returns the process's open-file limit (its soft RLIMIT_NOFILE), or 0 when it is
// unknown or too large to matter.
func OpenFileLimit() int { return openFileLimit() }

// rejectAnswer is what a connection over the cap reads before its connection closes;
// rejectHeadAnswer is the answer to a HEAD (RFC 9110 §9.3.2: no body). It has no Content-Length
// either (optional for a HEAD), so that a client reading it as any answer, to the close, reads
// no body rather than waiting for one.
var rejectAnswer, rejectHeadAnswer = func() ([]byte, []byte) {
	body := `{"error":{"type":"overloaded","message":"too many open connections; retry shortly"}}` + "\n"
	head := "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n" +
		"Connection: close\r\n"
	return []byte(head + "Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body), []byte(head + "\r\n")
}()

// maxRejecting bounds the connections being refused at once; past it one is closed without an
// answer, so that a flood cannot turn refusals into the resource it exhausts.
const maxRejecting = 64

// rejectTimeout bounds the answer to a refused connection and the read of what it sent.
const rejectTimeout = time.Second

// LimitListener returns a listener that holds at most max connections open (max ≤ 0:
// DefaultMaxConnections). A connection accepted above it is answered 503 with Retry-After and
// closed; Accept goes on at once. A returned connection frees its place when closed. metrics
// may be nil.
func LimitListener(ln net.Listener, max int, metrics *Metrics) net.Listener {
	if max <= 0 {
		max = DefaultMaxConnections()
	}
	return &limitListener{Listener: ln, max: int64(max), metrics: metrics}
}

type limitListener struct {
	net.Listener
	max       int64
	open      atomic.Int64
	rejecting atomic.Int64
	metrics   *Metrics
}

// Open returns the number of open connections it accepted.
func (l *limitListener) Open() int { return int(l.open.Load()) }

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) <= l.max {
			l.metrics.opened()
			return &limitConn{Conn: c, release: func() { l.open.Add(-1); l.metrics.closed() }}, nil
		}
		l.open.Add(-1)
		l.metrics.rejected()
		if l.rejecting.Add(1) > maxRejecting {
			l.rejecting.Add(-1)
			_ = c.Close()
			continue
		}
		go func() {
			defer l.rejecting.Add(-1)
			reject(c)
		}()
	}
}

// reject answers 503 and closes c. It reads the request's method first, for half of
// rejectTimeout at most (a client that sends nothing then gets the answer of a GET): a HEAD's
// answer has no body. It closes its side for writing, then reads what the client sent until the
// client closes too (or rejectTimeout): closing a socket with unread input sends a reset, which
// can destroy the answer before the client reads it.
func reject(c net.Conn) {
	defer c.Close()
	deadline := time.Now().Add(rejectTimeout)
	_ = c.SetDeadline(deadline)
	_ = c.SetReadDeadline(time.Now().Add(rejectTimeout / 2))
	answer := rejectAnswer
	if isHead(c) {
		answer = rejectHeadAnswer
	}
	_ = c.SetReadDeadline(deadline)
	if _, err := c.Write(answer); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// isHead reads the first bytes of the request on c, as far as "HEAD ", and reports whether its
// method is HEAD. What it reads is not needed: the answer is the same whatever the request.
func isHead(c net.Conn) bool {
	const want = "HEAD "
	var buf [len(want)]byte
	for n := 0; n < len(want); {
		m, err := c.Read(buf[n:])
		n += m
		if !strings.HasPrefix(want, string(buf[:n])) || err != nil && n < len(want) {
			return false
		}
	}
	return true
}

// limitConn gives its place back once, on its first Close.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
