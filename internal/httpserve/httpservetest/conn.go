// Package httpservetest is a raw HTTP/1.1 client connection for tests of hostile clients: one
// that trickles, stalls or idles on a real socket. For tests only.
package httpservetest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Deadline bounds every read and write of a Conn: far above the timeouts under test, so that a
// server that does not cut a connection off fails the test instead of hanging it.
const Deadline = 5 * time.Second

// Wait bounds a test's wait for a condition, or for a call that must succeed, that no timeout of
// the server's races: as long as a loaded machine under the race detector may need, ended early
// when the condition holds. Deadline stays the bound of a Conn's reads and writes, where being
// short is what tells a server's configured cut-off from its default one.
const Wait = 30 * time.Second

// Conn is a raw client connection, closed when the test ends.
type Conn struct {
	net.Conn
	r *bufio.Reader
}

// Dial connects to addr. readBuffer, when positive, shrinks the socket's receive buffer (a
// client that stops reading then stalls the server sooner).
func Dial(t testing.TB, addr string, readBuffer int) *Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, Deadline)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	if readBuffer > 0 {
		require.NoError(t, c.(*net.TCPConn).SetReadBuffer(readBuffer))
	}
	require.NoError(t, c.SetDeadline(time.Now().Add(Deadline)))
	return &Conn{Conn: c, r: bufio.NewReader(c)}
}

// Send writes the request head: method, path and header lines ("Name: value"), and Host.
func (c *Conn) Send(t testing.TB, method, path string, header ...string) {
	t.Helper()
	head := method + " " + path + " HTTP/1.1\r\nHost: llmq\r\n"
	for _, h := range header {
		head += h + "\r\n"
	}
	_, err := io.WriteString(c, head+"\r\n")
	require.NoError(t, err)
}

// Get sends a GET of path and reads its answer.
func (c *Conn) Get(t testing.TB, path string) *http.Response {
	t.Helper()
	c.Send(t, http.MethodGet, path)
	return c.Response(t)
}

// Response reads the next answer and its body, which it drops (Body is then a closed reader):
// for a test that reads the status line and header of answers in a row on one connection.
func (c *Conn) Response(t testing.TB) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(c.r, nil)
	require.NoError(t, err, "no answer before the client's deadline")
	_, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	return resp
}

// Head reads the next answer's status line and header, leaving its body unread.
func (c *Conn) Head(t testing.TB) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(c.r, nil)
	require.NoError(t, err, "no answer before the client's deadline")
	return resp
}

// Trickle writes one byte of body every interval until the server stops taking them or n are
// written; the returned function stops it and waits for it.
func (c *Conn) Trickle(every time.Duration, n int) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for range n {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			if _, err := c.Write([]byte("x")); err != nil {
				return
			}
		}
	}()
	return func() { close(quit); <-done }
}

// RequireClosed requires the server to close the connection before the deadline: an end of
// stream, or a reset when it closed with input of ours unread.
func (c *Conn) RequireClosed(t testing.TB) {
	t.Helper()
	_, err := c.r.ReadByte()
	if !errors.Is(err, syscall.ECONNRESET) {
		require.ErrorIs(t, err, io.EOF, "the server did not close the connection")
	}
}

// StallListener wraps a server's listener for tests of a client that stops reading: it shrinks
// each accepted connection's send buffer, so that such a client stalls the server after
// kilobytes rather than after the megabytes loopback buffers hold, it tells WaitClosed of
// each connection the server closes, and it keeps the write deadlines the server sets
// (WriteDeadlineSpan). Make it with NewStallListener.
type StallListener struct {
	net.Listener
	closed chan string
	spans  *deadlineSpans
}

// NewStallListener wraps inner.
func NewStallListener(inner net.Listener) *StallListener {
	return &StallListener{Listener: inner, closed: make(chan string, 16), spans: &deadlineSpans{longest: map[string]time.Duration{}}}
}

// WriteDeadlineSpan is the longest time ahead of its setting that the server set a write
// deadline on its end of c, or 0 when it set none. A deadline is computed before it is set, so
// the span is at most the server's bound however loaded the machine: a test tells a configured
// write bound from a longer default one by it, without racing the clock.
func (l *StallListener) WriteDeadlineSpan(c *Conn) time.Duration {
	return l.spans.get(c.LocalAddr().String())
}

// deadlineSpans keeps, by remote address, the longest write deadline span of each connection.
type deadlineSpans struct {
	mu      sync.Mutex
	longest map[string]time.Duration
}

func (d *deadlineSpans) set(addr string, deadline time.Time) {
	if deadline.IsZero() {
		return
	}
	span := time.Until(deadline)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.longest[addr] = max(d.longest[addr], span)
}

func (d *deadlineSpans) get(addr string) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.longest[addr]
}

// Accept implements net.Listener.
func (l *StallListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(16 << 10)
	}
	return &notifyingConn{Conn: c, closed: l.closed, spans: l.spans}, nil
}

// CloseWait bounds WaitClosed: the server's cut-off comes after its own work (authenticate, read
// the job, write until the write deadline), which on loaded cores under the race detector took
// longer than Deadline; a server that never cuts the connection off still fails the test.
const CloseWait = 30 * time.Second

// WaitClosed waits until the server has closed its end of c, and fails the test (msg) if it
// has not within CloseWait. It reads nothing from c, and renews c's deadline when it returns: the
// reads of what the server wrote before closing get a whole Deadline, however long the wait took
// on a loaded machine (they had what was left of the one set at Dial).
func (l *StallListener) WaitClosed(t testing.TB, c *Conn, msg string) {
	t.Helper()
	deadline := time.After(CloseWait)
	for {
		select {
		case addr := <-l.closed:
			if addr == c.LocalAddr().String() {
				require.NoError(t, c.SetDeadline(time.Now().Add(Deadline)))
				return
			}
		case <-deadline:
			t.Fatal(msg)
		}
	}
}

// notifyingConn sends its remote address on closed when it is first closed, and keeps the
// write deadlines set on it in spans.
type notifyingConn struct {
	net.Conn
	closed chan string
	once   sync.Once
	spans  *deadlineSpans
}

func (c *notifyingConn) SetDeadline(t time.Time) error {
	c.spans.set(c.RemoteAddr().String(), t)
	return c.Conn.SetDeadline(t)
}

func (c *notifyingConn) SetWriteDeadline(t time.Time) error {
	c.spans.set(c.RemoteAddr().String(), t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *notifyingConn) Close() error {
	c.once.Do(func() {
		select {
		case c.closed <- c.RemoteAddr().String():
		default: // nobody is waiting for so many
		}
	})
	return c.Conn.Close()
}
