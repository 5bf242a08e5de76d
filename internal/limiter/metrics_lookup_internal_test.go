package limiter

import (
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

// TestGate_SeriesLookedUpOnce: a Gate keeps its credential's series and does not look them up
// in the vectors again on each use (the lookups were ~1% of a job's CPU): a series taken out of
// its vector behind the metrics' back is not made again, as a lookup would make it. (No vector
// of the limiter's is ever pruned; this only shows where the series come from.) A new Gate of
// the same credential looks its series up.
func TestGate_SeriesLookedUpOnce(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	t.Cleanup(func() { _ = rdb.Close() })
	m := NewMetrics(prometheus.NewRegistry())
	l, err := New(rdb, &Config{Metrics: m})
	require.NoError(t, err)

	g := l.Gate("sk-main", "main")
	g.pauseState("", false, "", "", false)
	require.True(t, m.paused.DeleteLabelValues("main"))
	g.pauseState("1", true, "429", "job", false)
	require.False(t, m.paused.DeleteLabelValues("main"), "the gate looked its series up again")

	l.Gate("sk-main", "main").pauseState("", false, "", "", false)
	require.True(t, m.paused.DeleteLabelValues("main"), "a new gate's series")
}

// TestGateSeries_ConcurrentFirstUse: goroutines that use a Gate's series for the first time at
// once make each series once and lose no count (run under -race).
func TestGateSeries_ConcurrentFirstUse(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	g := newGateSeries(m, "main")
	const n, each = 8, 50
	job := Reservation{Limit: Limit{Rate: 5, Burst: 1}, Source: SourceConfigured, Granted: true, Grant: 1,
		Cost: tokens.Cost{InputTokens: 1, OutputTokens: 2}, Tokens: TokenBuckets{Combined: TokenBucket{PerMinute: 300}}}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for range each {
				g.reserved(job)
				g.reconciled(tokens.Cost{InputTokens: 1, OutputTokens: 1})
				g.refused()
				g.setPaused(false)
			}
		})
	}
	wg.Wait()
	require.InDelta(t, n*each, testutil.ToFloat64(m.tokensReserved.WithLabelValues("main", "input")), 0)
	require.InDelta(t, 2*n*each, testutil.ToFloat64(m.tokensReserved.WithLabelValues("main", "output")), 0)
	require.InDelta(t, n*each, testutil.ToFloat64(m.tokensReported.WithLabelValues("main", "output")), 0)
	require.InDelta(t, n*each, testutil.ToFloat64(m.refusals.WithLabelValues("main")), 0)
	require.InDelta(t, 300, testutil.ToFloat64(m.tokenLimit.WithLabelValues("main", "tokens")), 0)
}
