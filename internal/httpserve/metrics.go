package httpserve

import "github.com/prometheus/client_golang/prometheus"

// Metrics are a server's connection metrics. A nil *Metrics records nothing.
type Metrics struct {
	open    prometheus.Gauge
	refused prometheus.Counter
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_http_connections_open", Help: "Open HTTP connections (at most api.max_connections).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_http_connections_rejected_total", Help: "Connections answered 503 and closed because api.max_connections were open.",
		}),
	}
	reg.MustRegister(m.open, m.refused)
	return m
}

func (m *Metrics) opened() {
	if m != nil {
		m.open.Inc()
	}
}

func (m *Metrics) closed() {
	if m != nil {
		m.open.Dec()
	}
}

func (m *Metrics) rejected() {
	if m != nil {
		m.refused.Inc()
	}
}
