package api

import (
	"encoding/json"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/jobs"
)

// slowListener wraps a server's listener so that each accepted connection sends as a client
// that reads slowly but steadily would let it: every step bytes written move clock by every, and
// a write that would still be under way at the connection's write deadline (read on clock)
// sends what it had sent by then and fails, as a socket's write does at its deadline. The real
// socket takes everything at once: the slowness is the clock's alone, so the test is exact.
type slowListener struct {
	net.Listener
	clock *clocktest.Clock
	step  int
	every time.Duration
	// onStep, when set, is called after every step.
	onStep func()
}

func (l *slowListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &slowConn{Conn: c, l: l}, nil
}

type slowConn struct {
	net.Conn
	l        *slowListener
	mu       sync.Mutex
	deadline time.Time // the write deadline, on l.clock (zero: none)
}

// SetWriteDeadline records t, on the clock; the real socket gets none.
func (c *slowConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deadline = t
	return nil
}

// SetDeadline sets the read deadline on the socket and the write deadline on the clock.
func (c *slowConn) SetDeadline(t time.Time) error {
	_ = c.SetWriteDeadline(t)
	return c.Conn.SetReadDeadline(t)
}

func (c *slowConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	deadline := c.deadline
	c.mu.Unlock()
	for sent := 0; sent < len(p); sent += c.l.step {
		if !deadline.IsZero() && c.l.clock.Now().Add(c.l.every).After(deadline) {
			n, err := c.Conn.Write(p[:sent])
			if err == nil {
				err = os.ErrDeadlineExceeded
			}
			return n, err
		}
		c.l.clock.Advance(c.l.every)
		if c.l.onStep != nil {
			c.l.onStep()
		}
	}
	return c.Conn.Write(p)
}

// TestEvents_SlowSteadyReaderGetsALargeEvent: a client that reads steadily, if slowly (10 KB/s,
// a poor mobile link), gets an event that takes longer than the event write timeout to send (a
// 256 KB result: 26 s): the deadline bounds a wait without progress, not the whole event. It
// bounded the whole event: such a client was cut off mid-event, came back with the same
// Last-Event-ID and was cut off again, and never got its result.
func TestEvents_SlowSteadyReaderGetsALargeEvent(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	b := setup(t, setupOpts{eventWriteTimeout: 10 * time.Second, writeNow: clock.Now,
		listener: func(inner net.Listener) net.Listener {
			return &slowListener{Listener: inner, clock: clock, step: 1 << 10, every: 100 * time.Millisecond}
		}})
	job := b.create(t, "")
	text := strings.Repeat("x", 256<<10)
	result, err := json.Marshal(map[string]string{"text": text})
	require.NoError(t, err)
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: result})

	start := clock.Now()
	s := openStream(t, b.url, job.ID, "")
	s.lines.Buffer(nil, 1<<20) // the event's data line is one line of 256 KB
	f, ok := s.next(t)
	require.True(t, ok, "the stream was cut off %s into the event (clock time)", clock.Now().Sub(start))
	require.Equal(t, "succeeded", f.event)
	require.Equal(t, text, jobData(t, f)["result"].(map[string]any)["text"])
	require.Greater(t, clock.Now().Sub(start), 20*time.Second, "the client read slowly")
}

// TestEvents_ShutdownCutsAStreamMidEvent: a stream that is sending a large event to a slow reader
// when the API shuts down ends then, between two pieces of the event, as every other stream
// does: its client comes back with the Last-Event-ID it had, to another replica, and gets the
// event whole there. It went on to the event's end, the shutdown's grace holding for it.
func TestEvents_ShutdownCutsAStreamMidEvent(t *testing.T) {
	t.Parallel()
	clock := clocktest.New(time.Now())
	var b *testBundle
	steps := 0 // onStep runs on the stream's goroutine, one write at a time
	ln := &slowListener{clock: clock, step: 1 << 10, every: 100 * time.Millisecond, onStep: func() {
		if steps++; steps == 64 { // a quarter of the event sent
			b.srv.Shutdown()
		}
	}}
	b = setup(t, setupOpts{eventWriteTimeout: 10 * time.Second, writeNow: clock.Now,
		listener: func(inner net.Listener) net.Listener { ln.Listener = inner; return ln }})
	job := b.create(t, "")
	result, err := json.Marshal(map[string]string{"text": strings.Repeat("x", 256<<10)})
	require.NoError(t, err)
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: result})

	start := clock.Now()
	s := openStream(t, b.url, job.ID, "")
	s.lines.Buffer(nil, 1<<20)
	f, ok, err := readFrame(s.lines)
	require.Error(t, err, "the stream went on after the shutdown: got %q (ok %v)", f.event, ok)
	require.Less(t, clock.Now().Sub(start), 10*time.Second, "the rest of the event was sent")
}
