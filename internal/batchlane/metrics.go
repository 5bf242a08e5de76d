package batchlane

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the batch lane's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	batches *prometheus.CounterVec
	jobs    *prometheus.CounterVec
	files   *prometheus.CounterVec
	// lastPass is when the last pass that succeeded in this process started: a leader whose
	// passes fail or hang (a provider call or a statement that does not answer holds the lead
	// and logs nothing), or no leader at all, shows as a time that stops moving in every
	// process (the LLMQBatchLaneStalled rule).
	lastPass prometheus.Gauge
}

// Batch outcomes (label outcome of llmq_batch_batches_total).
var batchOutcomes = []string{"sent", "ended", "canceled", "refused", "lost"}

// Job outcomes (label outcome of llmq_batch_jobs_total): the job's new status, or where it went
// on: "rebatched" (a later batch), "online" (the online lane).
var jobOutcomes = []string{"succeeded", "failed", "dead", "rebatched", "online"}

// File delete outcomes (label outcome of llmq_batch_file_deletes_total): deleted (or gone
// already), failed (tried again after a backoff), gave_up (attempts used up: the file is left at
// the provider, its row in provider_batch_files kept for the operator).
var fileOutcomes = []string{"deleted", "failed", "gave_up"}

// NewMetrics registers the metrics on reg, each series at 0 for every credential in credentials.
// It panics if they are registered there already (a wiring bug).
func NewMetrics(reg prometheus.Registerer, credentials []string) *Metrics {
	m := &Metrics{
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_batch_batches_total",
			Help: "Provider batches by outcome: sent, ended (results recorded), canceled (no job waited for it: canceled by llmq), refused (by the provider, at the send or failed as a whole: jobs sent online), lost (unknown to the provider before it ended or was canceled by llmq: its waiting jobs sent round again).",
		}, []string{"credential", "outcome"}),
		jobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_batch_jobs_total",
			Help: "Batch-lane jobs decided by the batcher, by outcome: succeeded, failed, dead, rebatched (a later batch), online (sent to the online lane).",
		}, []string{"credential", "outcome"}),
		files: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_batch_file_deletes_total",
			Help: "Deletes of the batch lane's files at the provider (OpenAI's batch input, output and error files), by outcome: deleted (or gone already), failed (tried again after a backoff), gave_up (attempts used up: left at the provider, its row in provider_batch_files kept).",
		}, []string{"credential", "outcome"}),
		lastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_batch_last_success_timestamp_seconds",
			Help: "Start (Unix time) of the last batch-lane pass that succeeded in this process while it led the batch lane; " +
				"0: none yet. The max over the workers is the leader's.",
		}),
	}
	reg.MustRegister(m.batches, m.jobs, m.files, m.lastPass)
	for _, c := range credentials {
		for _, o := range batchOutcomes {
			m.batches.WithLabelValues(c, o)
		}
		for _, o := range jobOutcomes {
			m.jobs.WithLabelValues(c, o)
		}
		for _, o := range fileOutcomes {
			m.files.WithLabelValues(c, o)
		}
	}
	return m
}

// passed records that a pass that started at start succeeded.
func (m *Metrics) passed(start time.Time) {
	if m != nil {
		m.lastPass.Set(float64(start.UnixNano()) / 1e9)
	}
}

func (m *Metrics) batch(credential, outcome string) {
	if m != nil {
		m.batches.WithLabelValues(credential, outcome).Inc()
	}
}

// fileDelete counts a delete of a batch file by outcome (fileOutcomes).
func (m *Metrics) fileDelete(credential, outcome string) {
	if m != nil {
		m.files.WithLabelValues(credential, outcome).Inc()
	}
}

// job counts a move that applied.
func (m *Metrics) job(credential string, mv move) {
	if m == nil {
		return
	}
	outcome := mv.Status
	switch {
	case mv.Status != "retrying" && mv.Status != "queued":
	case mv.Lane == "online":
		outcome = "online"
	default:
		outcome = "rebatched"
	}
	m.jobs.WithLabelValues(credential, outcome).Inc()
}
