package dispatch_test

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/redistest"
)

// holdingProxy is a TCP proxy to Redis that holds back the replies on every connection that has
// carried marker, until release: a round trip that takes as long as the test wants.
type holdingProxy struct {
	ln      net.Listener
	target  string
	marker  []byte
	release chan struct{}
	wg      sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn
}

func startHoldingProxy(t *testing.T, target string, marker []byte) *holdingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &holdingProxy{ln: ln, target: target, marker: marker, release: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *holdingProxy) accept() {
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
		var held atomic.Bool
		p.wg.Add(2)
		// client → Redis: a command with the marker holds this connection's replies
		go p.pump(s, c, func(b []byte) {
			if bytes.Contains(b, p.marker) {
				held.Store(true)
			}
		})
		// Redis → client
		go p.pump(c, s, func([]byte) {
			if held.Load() {
				<-p.release
			}
		})
	}
}

// pump copies src to dst, calling before with each chunk before writing it, until either ends;
// then it closes dst.
func (p *holdingProxy) pump(dst, src net.Conn, before func([]byte)) {
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

// unhold lets every held reply go.
func (p *holdingProxy) unhold() {
	select {
	case <-p.release:
	default:
		close(p.release)
	}
}

func (p *holdingProxy) close() {
	p.unhold()
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// With more than one batch in flight, a command does not wait while an earlier batch's round
// trip is held up; with one (an ordered stream), it does. Each caller still gets its own reply.
func TestAutoPipelined_BatchesInFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		batches     int
		overtakes   bool
		description string
	}{
		{batches: 2, overtakes: true, description: "a second batch goes while the first is held"},
		{batches: 1, overtakes: false, description: "one ordered stream: the second waits for the first"},
	} {
		t.Run(tc.description, func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			opt, err := redis.ParseURL(redistest.URL())
			require.NoError(t, err)
			slow := prefix + "slow"
			proxy := startHoldingProxy(t, opt.Addr, []byte(slow))
			opt.Addr = proxy.ln.Addr().String()
			rdb := redis.NewClient(opt)
			ap := dispatch.AutoPipelined(rdb, tc.batches)
			_, isAP := ap.(*redis.AutoPipeliner)
			require.True(t, isAP, "a plain client gets an autopipeliner")
			defer func() {
				proxy.unhold()
				require.NoError(t, rdb.Close())
			}()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			direct := redistest.Client(t)

			first := make(chan error, 1)
			go func() { first <- ap.Set(ctx, slow, "1", 0).Err() }()
			// The first batch is out once its reply is held: Redis has its key.
			require.Eventually(t, func() bool { return direct.Exists(ctx, slow).Val() == 1 },
				5*time.Second, time.Millisecond, "the first command reached Redis")

			second := make(chan error, 1)
			go func() { second <- ap.Set(ctx, prefix+"fast", "2", 0).Err() }()
			if tc.overtakes {
				select {
				case err := <-second:
					require.NoError(t, err)
				case <-ctx.Done():
					t.Fatal("the second command waited for the held batch")
				}
				select {
				case <-first:
					t.Fatal("the first command's reply was held")
				default:
				}
				proxy.unhold()
				require.NoError(t, <-first)
				return
			}
			// One ordered stream: the second command is sent only after the first batch's reply.
			// Its key stays absent while that reply is held (checked for a while: the
			// counterfactual, a second batch, sets it within a millisecond or so).
			require.Never(t, func() bool { return direct.Exists(ctx, prefix+"fast").Val() == 1 },
				200*time.Millisecond, 5*time.Millisecond, "the second command went before the first batch's reply")
			proxy.unhold()
			require.NoError(t, <-first)
			require.NoError(t, <-second)
		})
	}
}

// A client without an autopipeliner (a cluster client) is returned as it is.
func TestAutoPipelined_ClusterClientAsItIs(t *testing.T) {
	t.Parallel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer func() { require.NoError(t, cc.Close()) }()
	require.Same(t, cc, dispatch.AutoPipelined(cc, 2))
}
