package redistest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Stalled is the address of a Redis that accepts connections and never answers (a Redis
// stalled by a long script, a full disk's fsync, a network partition after the handshake), and
// the function that ends the stall: its listener and connections closed, a client fails at
// once. The function also runs at the test's end.
func Stalled(t testing.TB) (addr string, end func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen for a stalled redis: %v", err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				_ = c.Close()
				continue
			}
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
		}
	})
	end = sync.OnceFunc(func() {
		_ = ln.Close()
		mu.Lock()
		closed = true
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	t.Cleanup(end)
	return ln.Addr().String(), end
}
