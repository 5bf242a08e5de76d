package limiter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/tokens"
)

// Metrics are the limiter's Prometheus metrics. Their only label is the credential's name (never
// its key). A nil *Metrics records nothing.
type Metrics struct {
	rate      *prometheus.GaugeVec
	burst     *prometheus.GaugeVec
	source    *prometheus.GaugeVec
	wait      *prometheus.HistogramVec
	probes    *prometheus.CounterVec
	pushbacks *prometheus.CounterVec
	refusals  *prometheus.CounterVec
	paused    *prometheus.GaugeVec
	// token limits
	tokenLimit     *prometheus.GaugeVec
	tokensReserved *prometheus.CounterVec
	tokensReported *prometheus.CounterVec
}

// NewMetrics creates the limiter's metrics and registers them with reg (nil: not registered).
// It panics if they are already registered there, a programming error.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	cred := []string{"credential"}
	m := &Metrics{
		rate: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_limiter_limit_requests_per_second",
			Help: "Request rate the limiter paces the credential at (configured or learned; 0 while unknown).",
		}, cred),
		burst: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_limiter_limit_burst_requests",
			Help: "Burst (bucket capacity) the limiter allows the credential (0 while unknown).",
		}, cred),
		source: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_limiter_limit_source",
			Help: "1 for where the credential's limit comes from: configured, learned or unknown.",
		}, []string{"credential", "source"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmq_limiter_wait_seconds",
			Help:    "Wait from a granted reservation to its send time.",
			Buckets: []float64{0, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, cred),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_limiter_probes_total",
			Help: "Requests let out alone to learn an unknown limit.",
		}, cred),
		pushbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_limiter_retry_after_pushbacks_total",
			Help: "429 responses with Retry-After that pushed the shared schedule back.",
		}, cred),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_retry_budget_refusals_total",
			Help: "Retries refused (deferred) because the credential's retry budget was spent.",
		}, cred),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_limiter_paused",
			Help: "1 while the credential is paused (a 429 without Retry-After), as last seen by this process.",
		}, cred),
		tokenLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_limiter_limit_tokens_per_minute",
			Help: "Token bucket capacity (tokens per minute) the limiter paces the credential at, per bucket (0 while unknown).",
		}, []string{"credential", "bucket"}),
		tokensReserved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_limiter_tokens_reserved_total",
			Help: "Tokens reserved before sending (estimated input, max_tokens output) for slots that charged a token bucket.",
		}, []string{"credential", "kind"}),
		tokensReported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_limiter_tokens_reported_total",
			Help: "Tokens the provider reported (usage), reconciled against reserved ones.",
		}, []string{"credential", "kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.rate, m.burst, m.source, m.wait, m.probes, m.pushbacks, m.refusals, m.paused,
			m.tokenLimit, m.tokensReserved, m.tokensReported)
	}
	return m
}

// InitCredentials gives each credential's counters a 0 at start, so that the first increase
// after a start shows in rate() and increase() (and the rules that read them fire). The pause
// gauge is set by the first Gate.Paused instead: only Redis knows it.
func (m *Metrics) InitCredentials(names []string) {
	if m == nil {
		return
	}
	for _, name := range names {
		m.probes.WithLabelValues(name)
		m.pushbacks.WithLabelValues(name)
		m.refusals.WithLabelValues(name)
	}
}

func (m *Metrics) reserved(name string, r Reservation) {
	if m == nil {
		return
	}
	m.rate.WithLabelValues(name).Set(r.Limit.Rate)
	m.burst.WithLabelValues(name).Set(float64(r.Limit.Burst))
	for _, s := range []Source{SourceConfigured, SourceLearned, SourceUnknown} {
		v := 0.0
		if s == r.Source {
			v = 1
		}
		m.source.WithLabelValues(name, string(s)).Set(v)
	}
	if r.Granted {
		m.wait.WithLabelValues(name).Observe(max(r.Wait.Seconds(), 0))
	}
	if r.Probe {
		m.probes.WithLabelValues(name).Inc()
	}
	if r.Tokens != (TokenBuckets{}) {
		m.tokenLimit.WithLabelValues(name, string(tokens.BucketInput)).Set(r.Tokens.Input.PerMinute)
		m.tokenLimit.WithLabelValues(name, string(tokens.BucketOutput)).Set(r.Tokens.Output.PerMinute)
		m.tokenLimit.WithLabelValues(name, string(tokens.BucketTokens)).Set(r.Tokens.Combined.PerMinute)
	}
	if r.Granted && r.Grant > 0 {
		m.tokensReserved.WithLabelValues(name, "input").Add(float64(r.Cost.InputTokens))
		m.tokensReserved.WithLabelValues(name, "output").Add(float64(r.Cost.OutputTokens))
	}
}

func (m *Metrics) reconciled(name string, actual tokens.Cost) {
	if m == nil {
		return
	}
	m.tokensReported.WithLabelValues(name, "input").Add(float64(actual.InputTokens))
	m.tokensReported.WithLabelValues(name, "output").Add(float64(actual.OutputTokens))
}

func (m *Metrics) pushedBack(name string) {
	if m != nil {
		m.pushbacks.WithLabelValues(name).Inc()
	}
}

func (m *Metrics) refused(name string) {
	if m != nil {
		m.refusals.WithLabelValues(name).Inc()
	}
}

func (m *Metrics) setPaused(name string, paused bool) {
	if m == nil {
		return
	}
	v := 0.0
	if paused {
		v = 1
	}
	m.paused.WithLabelValues(name).Set(v)
}
