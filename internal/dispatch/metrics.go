package dispatch

import "github.com/prometheus/client_golang/prometheus"

// Metrics are dispatch's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	swept     prometheus.Counter
	idleWaits *prometheus.CounterVec
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_sweeper_reenqueued_total", Help: "Jobs whose asynq task was missing and was enqueued again.",
		}),
		idleWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_worker_idle_waits_total",
			Help: "Waits of an idle worker for a task, by what ended them: a wake-up (a task enqueued, or moved to pending " +
				"by asynq) or the poll interval. Only polls while jobs flow: the wake-ups are not arriving.",
		}, []string{"ended"}),
	}
	for _, ended := range []string{waitEndedByWakeUp, waitEndedByPoll} {
		m.idleWaits.WithLabelValues(ended)
	}
	reg.MustRegister(m.swept, m.idleWaits)
	return m
}

// The ends of an idle worker's wait (llmq_worker_idle_waits_total's label).
const (
	waitEndedByWakeUp = "wake-up"
	waitEndedByPoll   = "poll"
)

func (m *Metrics) idleWaitEnded(by string) {
	if m != nil {
		m.idleWaits.WithLabelValues(by).Inc()
	}
}

func (m *Metrics) sweptOne() {
	if m != nil {
		m.swept.Inc()
	}
}
