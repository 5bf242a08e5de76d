package dispatch

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// killProxy is a TCP proxy to Redis that can cut the connections that carried a marker, as a
// CLIENT KILL of them would.
type killProxy struct {
	ln     net.Listener
	target string
	marker []byte
	wg     sync.WaitGroup

	mu     sync.Mutex
	conns  []net.Conn
	marked []net.Conn
}

func startKillProxy(t *testing.T, marker string) *killProxy {
	t.Helper()
	opt, err := redis.ParseURL(redistest.URL())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &killProxy{ln: ln, target: opt.Addr, marker: []byte(marker)}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *killProxy) url() string { return "redis://" + p.ln.Addr().String() + "/0" }

func (p *killProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(s, c, func(b []byte) {
			if bytes.Contains(b, p.marker) {
				p.mu.Lock()
				p.marked = append(p.marked, c, s)
				p.mu.Unlock()
			}
		})
		go p.pump(c, s, func([]byte) {})
	}
}

func (p *killProxy) pump(dst, src net.Conn, saw func([]byte)) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			saw(buf[:n])
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// kill cuts the connections that carried the marker and reports how many.
func (p *killProxy) kill() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.marked) / 2
	for _, c := range p.marked {
		_ = c.Close()
	}
	p.marked = nil
	return n
}

func (p *killProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestServer_AKilledHoldStillWakes: the connection of an idle server's held dequeue (its
// BZPOPMIN on the wake set) is cut, as a failover or CLIENT KILL would; a task enqueued next is
// still delivered long before the hold's time: the wait goes on on a new connection, and the
// wake-up ends it.
func TestServer_AKilledHoldStillWakes(t *testing.T) {
	t.Parallel()
	const poll = 3 * time.Second // a hold lasts poll/2 at the least: room for a loaded machine
	proxy := startKillProxy(t, "bzpopmin")
	r := newWakeRig(t, proxy.url(), poll)
	begun := r.holdBegun(t, 0)
	require.Eventually(t, func() bool { return proxy.kill() == 1 }, 5*time.Second, time.Millisecond,
		"the held dequeue's connection cut")
	require.NoError(t, r.enq.Enqueue(t.Context(), "after-the-cut", jobs.PriorityNormal, time.Time{}))
	require.Equal(t, "after-the-cut", r.next(t))
	require.Less(t, time.Since(begun), poll/2, "delivered long before the hold's time")
}
