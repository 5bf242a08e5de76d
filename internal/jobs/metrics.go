package jobs

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the job pipeline's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	submitted      *prometheus.CounterVec
	attempts       *prometheus.CounterVec
	attemptLatency *prometheus.HistogramVec
	outcomes       *prometheus.CounterVec
	deadLetters    *prometheus.CounterVec
	submitToResult *prometheus.HistogramVec
	swept          prometheus.Counter
}

// NewMetrics registers the metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		submitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_jobs_submitted_total", Help: "Jobs accepted by the API (replays not counted).",
		}, []string{"credential"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_attempts_total", Help: "Provider calls by outcome class.",
		}, []string{"credential", "class"}),
		attemptLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmq_attempt_duration_seconds", Help: "Latency of one provider call.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}, []string{"credential"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_jobs_finished_total", Help: "Jobs that reached a terminal status.",
		}, []string{"credential", "status"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_dead_letters_total", Help: "Jobs dead-lettered, by reason.",
		}, []string{"credential", "reason"}),
		submitToResult: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmq_job_duration_seconds", Help: "Submit to terminal status, retries and waits included: the latency the user sees.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16),
		}, []string{"credential", "status"}),
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_sweeper_reenqueued_total", Help: "Jobs whose asynq task was missing and was enqueued again.",
		}),
	}
	reg.MustRegister(m.submitted, m.attempts, m.attemptLatency, m.outcomes, m.deadLetters, m.submitToResult, m.swept)
	return m
}

func (m *Metrics) submit(credential string) {
	if m != nil {
		m.submitted.WithLabelValues(credential).Inc()
	}
}

func (m *Metrics) attempt(credential, class string, latency time.Duration) {
	if m == nil {
		return
	}
	m.attempts.WithLabelValues(credential, class).Inc()
	m.attemptLatency.WithLabelValues(credential).Observe(latency.Seconds())
}

func (m *Metrics) outcome(credential string, status Status, deadReason string, sinceSubmit time.Duration) {
	if m == nil {
		return
	}
	m.outcomes.WithLabelValues(credential, string(status)).Inc()
	m.submitToResult.WithLabelValues(credential, string(status)).Observe(sinceSubmit.Seconds())
	if status == StatusDead {
		m.deadLetters.WithLabelValues(credential, deadReason).Inc()
	}
}

func (m *Metrics) sweptOne() {
	if m != nil {
		m.swept.Inc()
	}
}
