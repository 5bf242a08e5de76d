package redistest

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// Cutter is a go-redis Dialer (Options.Dialer) whose connections can be cut right after Redis
// answered a chosen command: the command ran, and its reply is lost, as in a failover, a proxy
// restart or a CLIENT KILL at the worst moment. Arm it with the bytes that identify the command
// (a key, a script's SHA); the next connection to write them is closed at its next read, once
// that read got bytes from Redis (the reply), which the client never sees: it reads io.EOF. It
// is safe for concurrent use.
type Cutter struct {
	d     net.Dialer
	mu    sync.Mutex
	armed []byte
	cuts  atomic.Int64
}

// Arm makes the next connection that writes marker lose the reply that follows (once).
func (c *Cutter) Arm(marker string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed = []byte(marker)
}

// Cuts is how many connections were cut.
func (c *Cutter) Cuts() int { return int(c.cuts.Load()) }

// Dial implements go-redis's Options.Dialer.
func (c *Cutter) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := c.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: conn, c: c}, nil
}

// take reports whether p carries the armed marker, disarming it.
func (c *Cutter) take(p []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.armed) == 0 || !bytes.Contains(p, c.armed) {
		return false
	}
	c.armed = nil
	return true
}

type cutConn struct {
	net.Conn
	c   *Cutter
	cut atomic.Bool
}

func (cc *cutConn) Write(p []byte) (int, error) {
	if cc.c.take(p) {
		cc.cut.Store(true)
	}
	return cc.Conn.Write(p)
}

func (cc *cutConn) Read(p []byte) (int, error) {
	n, err := cc.Conn.Read(p)
	// The flag is looked at after the read: a reader blocked before the write (a full-duplex
	// client's) gets the reply in the read it had begun.
	if !cc.cut.Load() || n == 0 {
		return n, err
	}
	// Redis answered: the command ran. The reply is lost with the connection.
	cc.c.cuts.Add(1)
	_ = cc.Conn.Close()
	return 0, io.EOF
}

// CutClient returns a client to the test Redis whose connections a Cutter cuts, closed in
// t.Cleanup, with go-redis's default retries.
func CutClient(t testing.TB) (*redis.Client, *Cutter) {
	t.Helper()
	opt, err := redis.ParseURL(URL())
	if err != nil {
		t.Fatalf("parse TEST_REDIS_URL: %v", err)
	}
	cut := &Cutter{}
	opt.Dialer = cut.Dial
	c := redis.NewClient(opt)
	t.Cleanup(func() { _ = c.Close() })
	return c, cut
}
