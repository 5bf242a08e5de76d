package alert

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the alerter's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	// webhookFailures counts the alerts the webhook did not take: each is logged once and not
	// sent again, so without it whoever reads the webhook would never learn of the loss (the
	// LLMQAlertWebhookFailing rule).
	webhookFailures prometheus.Counter
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		webhookFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_alert_webhook_failures_total",
			Help: "Alerts whose POST to alerts.webhook_url failed (no answer, or a status above 299, a redirect " +
				"included) or was not made (8 posts already under way); each is logged (\"alert webhook failed\") " +
				"and not sent again.",
		}),
	}
	reg.MustRegister(m.webhookFailures)
	return m
}

func (m *Metrics) webhookFailed() {
	if m != nil {
		m.webhookFailures.Inc()
	}
}
