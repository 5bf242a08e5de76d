package leader

import "github.com/prometheus/client_golang/prometheus"

// Metrics is llmq_leader{duty}: 1 while this process leads the duty, 0 otherwise. A nil
// *Metrics records nothing.
type Metrics struct {
	leading *prometheus.GaugeVec
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{leading: prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "llmq_leader",
		Help: "1 while this process leads the duty (holds its Postgres advisory lock and runs it), 0 otherwise. " +
			"The sum over the processes is the duty's number of leaders: 0 while none leads.",
	}, []string{"duty"})}
	reg.MustRegister(m.leading)
	return m
}

// Duty returns duty's series, made now at 0 (a process that never leads exports 0, not nothing),
// for Run to set. It is nil on a nil *Metrics.
func (m *Metrics) Duty(duty string) prometheus.Gauge {
	if m == nil {
		return nil
	}
	g := m.leading.WithLabelValues(duty)
	g.Set(0)
	return g
}
