package dispatch

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// startKillProxy starts a TCP proxy to Redis that marks the connections that carried marker, to
// be cut (killMarked) as a failover or CLIENT KILL would.
func startKillProxy(t *testing.T, marker string) *redistest.Proxy {
	t.Helper()
	return redistest.NewProxy(t, func(c *redistest.ProxyConn, b []byte) {
		if bytes.Contains(b, []byte(marker)) {
			c.Marked.Store(true)
		}
	}, nil)
}

// killMarked cuts p's marked connections and reports how many.
func killMarked(p *redistest.Proxy) int {
	marked := p.Marked()
	for _, c := range marked {
		c.Marked.Store(false)
		c.Close()
	}
	return len(marked)
}

// TestServer_AKilledHoldStillWakes: the connection of an idle server's held dequeue (its
// BZPOPMIN on the wake set) is cut, as a failover or CLIENT KILL would; a task enqueued next is
// still delivered long before the hold's time (an hour): the wait goes on on a new connection,
// and the wake-up ends it.
func TestServer_AKilledHoldStillWakes(t *testing.T) {
	t.Parallel()
	proxy := startKillProxy(t, "bzpopmin")
	r := newHeldRig(t, proxy.URL())
	r.holdBegun(t, 0)
	require.Eventually(t, func() bool { return killMarked(proxy) == 1 }, 30*time.Second, time.Millisecond,
		"the held dequeue's connection cut")
	require.NoError(t, r.enq.Enqueue(t.Context(), "after-the-cut", jobs.PriorityNormal, time.Time{}))
	require.Equal(t, "after-the-cut", r.next(t), "delivered long before the hold's time")
	require.Equal(t, 1.0, r.waitsEndedBy(waitEndedByWakeUp), "the wake-up ended the hold")
}
