package breaker

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/metricseries"
)

// Metrics are the breaker's Prometheus metrics. Their only labels are the credential's name
// (never its key) and a state. A nil *Metrics records nothing. One Metrics may serve several
// Breakers of a process.
type Metrics struct {
	state       *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	rejections  *prometheus.CounterVec
}

// NewMetrics creates the breaker's metrics and registers them with reg (nil: not registered).
// It panics if they are already registered there, a programming error.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmq_breaker_state",
			Help: "1 for the credential's circuit breaker state (closed, open, half_open), as last seen by this process.",
		}, []string{"credential", "state"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_breaker_transitions_total",
			Help: "Circuit breaker transitions this process caused, by the state entered. Summed over processes: every transition once.",
		}, []string{"credential", "to"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_breaker_rejected_total",
			Help: "Requests the circuit breaker refused (deferred): open, half-open with the probe out, or closed with its cold-start slots taken.",
		}, []string{"credential"}),
	}
	if reg != nil {
		reg.MustRegister(m.state, m.transitions, m.rejections)
	}
	return m
}

// stateSeries is one credential's llmq_breaker_state series (closed, open, half_open), looked up
// on their first setting and kept for the Circuit's life: every admission and report sets all
// three, some six lookups a job (a hash of the labels and a search under a lock each), ~1% of a
// job's instructions (docs/benchmarks.md). Safe for concurrent use.
type stateSeries = metricseries.Lazy[[len(states)]prometheus.Gauge] // by states' index

// setState sets credential name's state series, kept in series (nil: looked up each time).
func (m *Metrics) setState(series *stateSeries, name string, s State) {
	if m == nil {
		return
	}
	lookUp := func() (gauges [len(states)]prometheus.Gauge) {
		for i, x := range states {
			gauges[i] = m.state.WithLabelValues(name, string(x))
		}
		return gauges
	}
	var gauges [len(states)]prometheus.Gauge
	if series != nil {
		gauges = series.Get(lookUp)
	} else {
		gauges = lookUp()
	}
	for i, x := range states {
		v := 0.0
		if x == s {
			v = 1
		}
		gauges[i].Set(v)
	}
}

func (m *Metrics) transitioned(name string, to State) {
	if m != nil {
		m.transitions.WithLabelValues(name, string(to)).Inc()
	}
}

func (m *Metrics) rejected(name string) {
	if m != nil {
		m.rejections.WithLabelValues(name).Inc()
	}
}
