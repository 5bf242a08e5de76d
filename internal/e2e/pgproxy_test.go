package e2e_test

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// pgProxy is a TCP proxy in front of the test's Postgres that a test can cut off: cut resets
// every open connection and refuses new ones (accepts and closes them at once) until restore.
type pgProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns map[net.Conn]struct{}
}

// newPGProxy starts a proxy to the Postgres of dbURL and returns it with dbURL rewritten to
// go through it. It stops when the test ends.
func newPGProxy(t *testing.T, dbURL string) (*pgProxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &pgProxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.serve()
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		p.cut()
	})
	u.Host = ln.Addr().String()
	return p, u.String()
}

func (p *pgProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			continue
		}
		go p.pipe(c)
	}
}

// track registers c unless the proxy is down.
func (p *pgProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *pgProxy) pipe(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(up) {
		c.Close()
		up.Close()
		return
	}
	go func() {
		io.Copy(up, c) //nolint:errcheck // ends when either side closes
		up.Close()
	}()
	io.Copy(c, up) //nolint:errcheck
	c.Close()
}

// cut resets every connection and refuses new ones until restore.
func (p *pgProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) //nolint:errcheck // a reset, as a crashed server gives
		}
		c.Close()
	}
	clear(p.conns)
}

func (p *pgProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}
