package redistest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Proxy is a TCP proxy to the test Redis for tests of a connection that misbehaves at a chosen
// moment: each chunk a client sends goes through Sent, and each chunk Redis answers through
// Received, before it is passed on (either may block, or mark the connection). Make it with
// NewProxy; it is closed when the test ends, its connections with it.
type Proxy struct {
	ln       net.Listener
	target   string
	sent     func(*ProxyConn, []byte)
	received func(*ProxyConn, []byte)
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns []*ProxyConn
}

// ProxyConn is one client connection through a Proxy and its own connection to Redis.
type ProxyConn struct {
	client, server net.Conn
	// Marked is the hooks' to set: Proxy.Marked lists the connections it is set on.
	Marked atomic.Bool
}

// Close cuts the connection on both sides.
func (c *ProxyConn) Close() {
	_ = c.client.Close()
	_ = c.server.Close()
}

// NewProxy starts a proxy to the test Redis (URL). sent and received may be nil.
func NewProxy(t testing.TB, sent, received func(*ProxyConn, []byte)) *Proxy {
	t.Helper()
	opt, err := redis.ParseURL(URL())
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nop := func(*ProxyConn, []byte) {}
	if sent == nil {
		sent = nop
	}
	if received == nil {
		received = nop
	}
	p := &Proxy{ln: ln, target: opt.Addr, sent: sent, received: received}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address (host:port), for a client's Options.Addr.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is a redis:// URL of database 0 through the proxy.
func (p *Proxy) URL() string { return "redis://" + p.Addr() + "/0" }

// Marked returns the connections whose Marked is set.
func (p *Proxy) Marked() []*ProxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	var marked []*ProxyConn
	for _, c := range p.conns {
		if c.Marked.Load() {
			marked = append(marked, c)
		}
	}
	return marked
}

func (p *Proxy) accept() {
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
		pc := &ProxyConn{client: c, server: s}
		p.mu.Lock()
		p.conns = append(p.conns, pc)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pump(s, c, func(b []byte) { p.sent(pc, b) })     // client → Redis
		go p.pump(c, s, func(b []byte) { p.received(pc, b) }) // Redis → client
	}
}

// pump copies src to dst, calling before with each chunk before writing it, until either ends;
// then it closes dst.
func (p *Proxy) pump(dst, src net.Conn, before func([]byte)) {
	defer p.wg.Done()
	defer dst.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			before(buf[:n])
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
