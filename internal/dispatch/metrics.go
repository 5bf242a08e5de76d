package dispatch

import "github.com/prometheus/client_golang/prometheus"

// Metrics are dispatch's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	swept     prometheus.Counter
	idleWaits *prometheus.CounterVec
	handoffs  *prometheus.CounterVec
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
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_worker_handoffs_total",
			Help: "Jobs submitted to this process's API (llmq serve) by what became of their first delivery: taken " +
				"(run in this process, with no asynq task), declined (a low job, every slot taken, or shutting down: " +
				"enqueued as a task), returned (taken, then handed to asynq: a deferral, a failure of the stores, a shutdown).",
		}, []string{"outcome"}),
	}
	for _, ended := range []string{waitEndedByWakeUp, waitEndedByPoll} {
		m.idleWaits.WithLabelValues(ended)
	}
	for _, outcome := range []string{handoffTaken, handoffDeclined, handoffReturned} {
		m.handoffs.WithLabelValues(outcome)
	}
	reg.MustRegister(m.swept, m.idleWaits, m.handoffs)
	return m
}

// The ends of an idle worker's wait (llmq_worker_idle_waits_total's label).
const (
	waitEndedByWakeUp = "wake-up"
	waitEndedByPoll   = "poll"
)

// What became of a job offered to a Handoff (llmq_worker_handoffs_total's label).
const (
	handoffTaken    = "taken"
	handoffDeclined = "declined"
	handoffReturned = "returned"
)

func (m *Metrics) handoff(outcome string) {
	if m != nil {
		m.handoffs.WithLabelValues(outcome).Inc()
	}
}

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
