package pgtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a test's Postgres that injects three faults on the wire:
//   - Cut resets every open connection and refuses new ones (accepts and closes them at once)
//     until Restore: Postgres unreachable, as when the network or the server drops. Reset
//     resets them and goes on accepting: connections dropped, the server still there.
//   - LoseNextBatchAnswer lets the next batch of statements commit and then drops the
//     connection before its client hears so. It cuts at the first ReadyForQuery that ends two or
//     more statements' results (a pipelined batch, whose Sync commits its implicit
//     transaction), without forwarding it: the server has committed by then, so the client sees
//     a broken connection for writes that took effect. LoseNextAnswer does the same for the
//     next transaction of one statement or more.
//   - Freeze silences every open connection: the proxy goes on reading both sides and forwards
//     nothing, closing nothing, as a partition or a failover behind a moved address leaves a
//     connection open and silent (no reset ever comes). New connections are served as usual.
//
// And one barrier: HoldStatement stops a connection just before a given statement reaches the
// server, until the test releases it.
type Proxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	loseAfter int // cut at the ReadyForQuery that ends this many statements' results or more (0: off)
	cuts      int
	down      bool
	refused   int
	conns     map[net.Conn]struct{}
	frozen    map[net.Conn]bool // connections Freeze silenced
	hold      *Hold             // armed, not yet reached (nil: none)
	holds     []*Hold           // every hold made, released when the proxy stops
}

// NewProxy starts a Proxy in front of the Postgres of dbURL and returns it with dbURL rewritten
// to go through it. It stops when the test ends. dbURL must not ask for TLS (URL's never do): the
// proxy reads the server's messages, and a TLS session would hide them.
func NewProxy(t testing.TB, dbURL string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("parse database URL: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen for the Postgres proxy: %v", err)
	}
	f := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}, frozen: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			if !f.track(client) {
				client.Close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer f.untrack(client)
				f.pipe(client)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.Cut() // ends the pipes
		f.mu.Lock()
		for _, h := range f.holds {
			h.Release() // so that no pipe waits for a test that has ended
		}
		f.mu.Unlock()
		wg.Wait()
	})
	u.Host = ln.Addr().String()
	return f, u.String()
}

// LoseNextBatchAnswer makes the proxy drop the next committed batch's answer (two statements or
// more).
func (f *Proxy) LoseNextBatchAnswer() { f.loseNext(2) }

// LoseNextAnswer makes the proxy drop the next committed answer to any statement.
func (f *Proxy) LoseNextAnswer() { f.loseNext(1) }

func (f *Proxy) loseNext(statements int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loseAfter = statements
}

// LostAnswers is how many answers the proxy has dropped.
func (f *Proxy) LostAnswers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cuts
}

// Cut resets every open connection and refuses new ones until Restore.
func (f *Proxy) Cut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = true
	f.resetLocked()
}

// Reset resets every open connection and goes on accepting new ones: connections dropped by
// the network with the server still reachable. Unlike Cut followed by Restore, a client that
// reconnects at once is never refused in between.
func (f *Proxy) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resetLocked()
}

// resetLocked resets every open connection; f.mu is held.
func (f *Proxy) resetLocked() {
	for c := range f.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as when the network drops
		}
		c.Close()
	}
}

// Freeze silences every connection open now, for good: what either side sends is read and
// dropped, and neither is closed, so each side waits for the other as across a partition (its
// socket never reports an error). Connections made after it are not affected.
func (f *Proxy) Freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		f.frozen[c] = true
	}
}

// silenced reports whether Freeze silenced the proxy's connection with client c.
func (f *Proxy) silenced(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frozen[c]
}

// Restore accepts connections again.
func (f *Proxy) Restore() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = false
}

// Hold is a statement held by HoldStatement.
type Hold struct {
	match             []byte
	reached, released chan struct{}
	once              sync.Once
}

// HoldStatement arms a barrier: the next statement whose SQL text contains substr (a simple
// Query, or the Parse that prepares it), on any connection, is not forwarded to Postgres until
// the returned Hold is released; the connection's later messages wait behind it. Reached is
// closed when a statement is held. A statement the connection prepared before is sent by name
// only and is not recognised: give the pool default_query_exec_mode=exec, or hold a statement's
// first run. One hold is armed at a time; arming another replaces one not yet reached.
func (f *Proxy) HoldStatement(substr string) *Hold {
	h := &Hold{reached: make(chan struct{}), released: make(chan struct{})}
	h.match = []byte(substr)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hold = h
	f.holds = append(f.holds, h)
	return h
}

// SilenceStatement arms a hold on the next statement whose SQL text contains substr (see
// HoldStatement) and returns a wait: it waits, at most until ctx ends, for a statement to reach
// the hold, then silences every connection open (Freeze) and lets the statement go, which thus
// goes out on a connection that never answers. The wait reports false when ctx ended first
// (the hold is released then all the same, unsilenced).
func (f *Proxy) SilenceStatement(substr string) (wait func(ctx context.Context) bool) {
	h := f.HoldStatement(substr)
	return func(ctx context.Context) bool {
		defer h.Release()
		select {
		case <-h.Reached():
			f.Freeze()
			return true
		case <-ctx.Done():
			return false
		}
	}
}

// Reached is closed once a statement is held.
func (h *Hold) Reached() <-chan struct{} { return h.reached }

// Release forwards the held statement (or, if none was held yet, lets the next one pass) and
// disarms the hold. It is idempotent.
func (h *Hold) Release() { h.once.Do(func() { close(h.released) }) }

// takeHold returns the armed hold if the client message of type typ with body matches it,
// disarming it.
func (f *Proxy) takeHold(typ byte, body []byte) *Hold {
	if typ != 'Q' && typ != 'P' {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hold == nil || !bytes.Contains(body, f.hold.match) {
		return nil
	}
	h := f.hold
	f.hold = nil
	return h
}

// Refused is how many connections the proxy refused while cut off.
func (f *Proxy) Refused() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.refused
}

// track registers an accepted connection; false (counted as refused) while cut off.
func (f *Proxy) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		f.refused++
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Proxy) untrack(c net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.conns, c)
	delete(f.frozen, c)
}

// takeCut reports whether to drop the answer that ends statements statements' results now,
// consuming the fault if so.
func (f *Proxy) takeCut(statements int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loseAfter == 0 || statements < f.loseAfter {
		return false
	}
	f.loseAfter, f.cuts = 0, f.cuts+1
	return true
}

// pipe proxies one connection: the client's bytes as they come, the server's message by message.
func (f *Proxy) pipe(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", f.target)
	if err != nil {
		return
	}
	defer server.Close()
	go func() {
		f.forward(server, client)
		server.Close()
	}()
	// Every message from the server is a type byte and a length that counts itself (the
	// client asks for no TLS, so there is no untyped reply to an SSLRequest).
	header := make([]byte, 5)
	statements := 0
	for {
		if _, err := io.ReadFull(server, header); err != nil {
			return
		}
		body := make([]byte, binary.BigEndian.Uint32(header[1:])-4)
		if _, err := io.ReadFull(server, body); err != nil {
			return
		}
		switch header[0] {
		case 'C': // CommandComplete: one statement done
			statements++
		case 'Z': // ReadyForQuery: the transaction is over
			if f.takeCut(statements) {
				return // the deferred closes drop both sides
			}
			statements = 0
		}
		if f.silenced(client) {
			continue
		}
		if _, err := client.Write(append(header, body...)); err != nil {
			return
		}
	}
}

// forward copies the client's messages to the server, stopping at a held statement until its
// release. The first message is the untyped startup packet (or a cancel request); every later one
// is a type byte and a length that counts itself.
func (f *Proxy) forward(server, client net.Conn) {
	var length [4]byte
	if _, err := io.ReadFull(client, length[:]); err != nil {
		return
	}
	n := binary.BigEndian.Uint32(length[:])
	if n < 4 || n > 10000 {
		return // not a startup packet
	}
	startup := make([]byte, n)
	copy(startup, length[:])
	if _, err := io.ReadFull(client, startup[4:]); err != nil {
		return
	}
	if _, err := server.Write(startup); err != nil {
		return
	}
	header := make([]byte, 5)
	for {
		if _, err := io.ReadFull(client, header); err != nil {
			return
		}
		msg := make([]byte, 5+binary.BigEndian.Uint32(header[1:])-4)
		copy(msg, header)
		if _, err := io.ReadFull(client, msg[5:]); err != nil {
			return
		}
		if h := f.takeHold(msg[0], msg[5:]); h != nil {
			close(h.reached)
			<-h.released
		}
		if f.silenced(client) {
			continue
		}
		if _, err := server.Write(msg); err != nil {
			return
		}
	}
}
