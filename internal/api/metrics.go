package api

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the API's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	submits *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		submits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_jobs_submitted_total", Help: "Jobs accepted by the API (replays not counted).",
		}, []string{"credential"}),
	}
	reg.MustRegister(m.submits)
	return m
}

func (m *Metrics) submitted(credential string) {
	if m != nil {
		m.submits.WithLabelValues(credential).Inc()
	}
}
