package maintenance

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/jobs"
)

// Metrics are the maintenance passes' Prometheus metrics. A nil *Metrics records nothing. The
// jobs the deadline pass fails are counted with the executor's (Config.Finished).
type Metrics struct {
	deletedJobs *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deletedJobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_retention_deleted_total",
			Help: "Finished jobs the retention pass deleted (each with its attempts, events and idempotency key), by status.",
		}, []string{"status"}),
	}
	reg.MustRegister(m.deletedJobs)
	for _, s := range finalStatuses {
		m.deletedJobs.WithLabelValues(string(s)) // 0 from the start: rate() needs a first sample
	}
	return m
}

func (m *Metrics) deleted(status jobs.Status, n int64) {
	if m != nil && n > 0 {
		m.deletedJobs.WithLabelValues(string(status)).Add(float64(n))
	}
}
