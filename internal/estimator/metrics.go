package estimator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/metricseries"
)

// Metrics are the estimator's Prometheus metrics, labelled by credential name (never its key). A
// nil *Metrics records nothing.
type Metrics struct {
	ratio *prometheus.HistogramVec
	// series holds each credential's ratio series, looked up in ratio once (issue 23: a lookup
	// per job hashed the label and searched under a lock; see metricseries).
	series metricseries.Map[string, prometheus.Observer]
}

// NewMetrics creates the estimator's metrics and registers them with reg (nil: not registered). It
// panics if they are already registered there, a programming error.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ratio: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmq_tokens_estimate_ratio",
			Help:    "Input tokens estimated before sending divided by the input tokens the provider reported (1 = exact).",
			Buckets: []float64{0.5, 0.8, 0.9, 0.95, 0.99, 1.01, 1.05, 1.1, 1.25, 1.5, 2, 4},
		}, []string{"credential"}),
	}
	if reg != nil {
		reg.MustRegister(m.ratio)
	}
	return m
}

func (m *Metrics) observe(credential string, estimated, reported int) {
	if m == nil {
		return
	}
	m.series.Get(credential, func(credential string) prometheus.Observer {
		return m.ratio.WithLabelValues(credential)
	}).Observe(float64(estimated) / float64(reported))
}
