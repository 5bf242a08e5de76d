package breaker

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// TestCircuit_StateSeriesLookedUpOnce: a Circuit keeps its credential's llmq_breaker_state
// series and does not look them up again on each admission (the lookups were part of ~1% of a
// job's CPU): a series taken out of its vector behind the metrics' back is not made again, as a
// lookup would make it. (The vector is never pruned; this only shows where the series come
// from.) A new Circuit of the same credential looks its series up.
func TestCircuit_StateSeriesLookedUpOnce(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	t.Cleanup(func() { _ = rdb.Close() })
	m := NewMetrics(prometheus.NewRegistry())
	b, err := New(rdb, &Config{Metrics: m})
	require.NoError(t, err)

	c := b.Circuit("sk-main", "main")
	c.ClosedAdmission(1)
	for _, s := range states {
		require.True(t, m.state.DeleteLabelValues("main", string(s)), s)
	}
	c.ClosedAdmission(2)
	for _, s := range states {
		require.False(t, m.state.DeleteLabelValues("main", string(s)), "%s: the circuit looked its series up again", s)
	}

	b.Circuit("sk-main", "main").ClosedAdmission(3)
	for _, s := range states {
		require.True(t, m.state.DeleteLabelValues("main", string(s)), "%s: a new circuit's series", s)
	}
}
