package maintenance

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/jobs"
)

// Metrics are the maintenance passes' Prometheus metrics. A nil *Metrics records nothing. The
// jobs the deadline pass fails are counted with the executor's (Config.Finished).
type Metrics struct {
	deletedJobs    *prometheus.CounterVec
	deletedBatches prometheus.Counter
	deletedAudit   prometheus.Counter
	deletedTokens  prometheus.Counter
	// backlog is, by kind (a final status, or audit), how long the oldest row the retention pass
	// has yet to delete has been past its period, measured by the leader after each batch.
	backlog *prometheus.GaugeVec
	// lastSuccess is when the last pass of each kind that succeeded in this process started:
	// a leader whose passes fail, or stall, or no leader at all, shows as a time that stops
	// moving in every process (the LLMQMaintenanceStalled rule).
	lastSuccess *prometheus.GaugeVec
	// failuresInARow is, by pass, how many of the leader's passes in a row have failed (0 after
	// one that succeeds). A retention pass that fails every time leaves no other trace: its date
	// is not a stall sign (a pass draining a backlog runs for hours), and its backlog freezes.
	failuresInARow *prometheus.GaugeVec
}

// kindAudit is the audit log's label value of llmq_retention_backlog_seconds (the others are
// final statuses).
const kindAudit = "audit"

// Passes, the label values of llmq_maintenance_last_success_timestamp_seconds.
const (
	passDeadline  = "deadline"
	passRetention = "retention"
)

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		deletedJobs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_retention_deleted_total",
			Help: "Finished jobs the retention pass deleted (each with its attempts, events and idempotency key), by status.",
		}, []string{"status"}),
		deletedBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_retention_deleted_provider_batches_total",
			Help: "Rows of the batch lane's provider batches the retention pass deleted (ended a day ago, holding no job).",
		}),
		deletedAudit: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_retention_deleted_audit_entries_total",
			Help: "Entries of the audit log (ctl's and the console's actions) the retention pass deleted (older than retention.audit).",
		}),
		deletedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_retention_deleted_previous_tokens_total",
			Help: "Tenants' tokens replaced by a rotation the retention pass deleted (their " +
				"overlap ended longer ago than retention.audit): a client sending one hears " +
				"unknown token, no longer rotated out.",
		}),
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_retention_backlog_seconds",
			Help: "How long the oldest row the retention pass has yet to delete has been past its period, by kind " +
				"(succeeded, failed, canceled, dead, audit; only those with a period), measured by the leading worker " +
				"after each batch it deletes; 0: none. Growing: retention falls behind. Only the leader exports it.",
		}, []string{"kind"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_maintenance_last_success_timestamp_seconds",
			Help: "Start (Unix time) of the last pass, by pass (deadline, retention), that succeeded in this process " +
				"while it led maintenance; 0: none yet. The max over the workers is the leader's.",
		}, []string{"pass"}),
		failuresInARow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_maintenance_failed_passes_in_a_row",
			Help: "How many passes in a row, by pass (deadline, retention), have failed in the leading worker; " +
				"0 after one that succeeds. Only the leader exports it.",
		}, []string{"pass"}),
	}
	reg.MustRegister(m.deletedJobs, m.deletedBatches, m.deletedAudit, m.deletedTokens, m.backlog,
		m.lastSuccess, m.failuresInARow)
	// 0 from the start: a deployment whose deadline pass never succeeds shows as such. The
	// retention pass's series appears with its first success (retention may be off).
	m.lastSuccess.WithLabelValues(passDeadline)
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

func (m *Metrics) deletedProviderBatches(n int64) {
	if m != nil && n > 0 {
		m.deletedBatches.Add(float64(n))
	}
}

func (m *Metrics) deletedAuditEntries(n int64) {
	if m != nil && n > 0 {
		m.deletedAudit.Add(float64(n))
	}
}

func (m *Metrics) deletedPreviousTokens(n int64) {
	if m != nil && n > 0 {
		m.deletedTokens.Add(float64(n))
	}
}

// backlogIs sets kind's backlog to late.
func (m *Metrics) backlogIs(kind string, late time.Duration) {
	if m != nil {
		m.backlog.WithLabelValues(kind).Set(late.Seconds())
	}
}

// stoppedLeading removes every kind's backlog and the passes' failures in a row: a process that
// stops leading measures none, and its last values would stand beside the new leader's.
func (m *Metrics) stoppedLeading() {
	if m != nil {
		m.backlog.Reset()
		m.failuresInARow.Reset()
	}
}

// passed records that a pass of kind pass that started at start succeeded.
func (m *Metrics) passed(pass string, start time.Time) {
	if m != nil {
		m.lastSuccess.WithLabelValues(pass).Set(float64(start.UnixNano()) / 1e9)
		m.failuresInARow.WithLabelValues(pass).Set(0)
	}
}

// failed records that a pass of kind pass failed (not one cut by the end of the lead).
func (m *Metrics) failed(pass string) {
	if m != nil {
		m.failuresInARow.WithLabelValues(pass).Inc()
	}
}
