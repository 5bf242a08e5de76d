package backlog

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the backlog's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	// waiting and oldestAge are the figures, exported only while this process measures (vectors,
	// to be removed when it stops: see stopped).
	waiting   *prometheus.GaugeVec
	oldestAge *prometheus.GaugeVec
	// lastSuccess is when the last measurement that succeeded in this process was made: a leader
	// whose measurements fail or hang, or no leader, shows as a date that stops moving.
	lastSuccess prometheus.Gauge
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_jobs_waiting",
			Help: "The online lane's jobs waiting for an attempt, by status (queued, retrying), measured in Postgres " +
				"by the worker leading maintenance every 15 s. Only the leader exports it.",
		}, []string{"status"}),
		oldestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_jobs_oldest_waiting_age_seconds",
			Help: "How long the oldest of the online lane's jobs waiting for an attempt had waited (since its " +
				"submission, or its retry from dead) at the last measurement; 0: none waits. Only the leader exports it.",
		}, nil),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_jobs_waiting_last_success_timestamp_seconds",
			Help: "When (Unix time) this process last measured the jobs waiting; 0: never. The max over the " +
				"workers is the leader's: a date that stops moving means figures that do not.",
		}),
	}
	reg.MustRegister(m.waiting, m.oldestAge, m.lastSuccess)
	return m
}

// set exports f and dates it.
func (m *Metrics) set(f Figures) {
	if m == nil {
		return
	}
	for s, n := range f.Waiting {
		m.waiting.WithLabelValues(string(s)).Set(float64(n))
	}
	m.oldestAge.WithLabelValues().Set(f.OldestAge().Seconds())
	m.lastSuccess.Set(float64(f.At.UnixNano()) / 1e9)
}

// stopped removes the figures (not their date): a process that no longer measures must not show
// its last figures beside the new leader's.
func (m *Metrics) stopped() {
	if m != nil {
		m.waiting.Reset()
		m.oldestAge.Reset()
	}
}
