package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// pgProxy is a TCP proxy between llmq and Postgres that can play "Postgres is down" without
// touching the machine's Postgres, which other programs share: while down it has cut every
// proxied connection and resets every new one at once. Safe for concurrent use.
type pgProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	down   bool
	closed bool
	conns  map[net.Conn]struct{} // both ends of every live proxied connection
	// refused counts the connections reset while down.
	refused int
	wg      sync.WaitGroup
}

// startPGProxy listens on a free 127.0.0.1 port and forwards every connection to target.
func startPGProxy(target string) (*pgProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("postgres proxy: listen: %w", err)
	}
	p := &pgProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// addr is the proxy's host:port.
func (p *pgProxy) addr() string { return p.ln.Addr().String() }

func (p *pgProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // a transient accept error (out of descriptors)
			continue
		}
		p.mu.Lock()
		down := p.down || p.closed
		if down {
			p.refused++
		}
		p.mu.Unlock()
		if down {
			reset(c)
			continue
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

// forward connects client to the target and copies both ways until either side ends, then
// closes both.
func (p *pgProxy) forward(client net.Conn) {
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		reset(client)
		return
	}
	p.mu.Lock()
	if p.down || p.closed {
		p.refused++
		p.mu.Unlock()
		reset(client)
		server.Close()
		return
	}
	p.conns[client], p.conns[server] = struct{}{}, struct{}{}
	p.mu.Unlock()
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			client.Close()
			server.Close()
			p.mu.Lock()
			delete(p.conns, client)
			delete(p.conns, server)
			p.mu.Unlock()
		})
	}
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(server, client); closeBoth() })
	wg.Go(func() { _, _ = io.Copy(client, server); closeBoth() })
	wg.Wait()
}

// setDown cuts every proxied connection and resets new ones (down), or lets new connections
// through again (up). It returns the number of connections cut (each proxied connection counts
// once).
func (p *pgProxy) setDown(down bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = down
	if !down {
		return 0
	}
	cut := len(p.conns) / 2
	for c := range p.conns {
		reset(c)
		delete(p.conns, c)
	}
	return cut
}

// refusedCount is the number of connections reset while down.
func (p *pgProxy) refusedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// close stops listening, cuts every connection and waits for the proxy's goroutines.
func (p *pgProxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

// reset closes c with an RST rather than a FIN when it can, the way a crashed server's
// connections end.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
