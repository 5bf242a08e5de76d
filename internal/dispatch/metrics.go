package dispatch

import "github.com/prometheus/client_golang/prometheus"

// Metrics are dispatch's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	swept prometheus.Counter
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_sweeper_reenqueued_total", Help: "Jobs whose asynq task was missing and was enqueued again.",
		}),
	}
	reg.MustRegister(m.swept)
	return m
}

func (m *Metrics) sweptOne() {
	if m != nil {
		m.swept.Inc()
	}
}
