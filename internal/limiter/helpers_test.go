package limiter_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/redistest"
)

// t0 is the injected clock's start.
var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

type testBundle struct {
	clock  *clocktest.Clock
	prefix string
	reg    *prometheus.Registry
	// lim and lim2 use separate Redis clients, as two processes would. Only lim has metrics.
	lim, lim2 *limiter.Limiter
}

// setup returns limiters on a fresh key prefix and an injected clock at t0; mod may adjust the
// config of both.
func setup(t *testing.T, mod func(*limiter.Config)) *testBundle {
	t.Helper()
	b := &testBundle{clock: clocktest.New(t0), prefix: redistest.Prefix(t), reg: prometheus.NewRegistry()}
	mk := func(m *limiter.Metrics) *limiter.Limiter {
		cfg := &limiter.Config{Prefix: b.prefix, Now: b.clock.Now, Metrics: m}
		if mod != nil {
			mod(cfg)
		}
		l, err := limiter.New(redistest.Client(t), cfg)
		require.NoError(t, err)
		return l
	}
	b.lim = mk(limiter.NewMetrics(b.reg))
	b.lim2 = mk(nil)
	return b
}

// metric returns the value of the metric name with the given credential label, or fails.
func (b *testBundle) metric(t *testing.T, name, credential string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			cred := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "credential" {
					cred = l.GetValue()
				}
			}
			if cred != credential {
				continue
			}
			switch {
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("metric %s{credential=%q} not found", name, credential)
	return 0
}
