package limiter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/metricseries"
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

// gateSeries is one credential's series of the limiter's metrics, each looked up (hashed by its
// labels in its vector) on its first use and kept for the Gate's life: a job's reservation and
// reconcile set some fifteen of them, and the lookups were ~1% of a job's instructions
// (docs/benchmarks.md). Each is resolved where the lookup used to be made, so the series a
// process exports are the same. A Gate's series are bounded by the metrics' fixed label values;
// a nil *gateSeries (a limiter without metrics) records nothing. Safe for concurrent use.
type gateSeries struct {
	m    *Metrics
	name string

	limits         metricseries.Lazy[[5]prometheus.Gauge] // rate, burst, source configured, learned, unknown
	wait           metricseries.Lazy[prometheus.Observer]
	probes         metricseries.Lazy[prometheus.Counter]
	pushbacks      metricseries.Lazy[prometheus.Counter]
	refusals       metricseries.Lazy[prometheus.Counter]
	paused         metricseries.Lazy[prometheus.Gauge]
	tokenLimit     metricseries.Lazy[[3]prometheus.Gauge]   // input, output, tokens
	tokensReserved metricseries.Lazy[[2]prometheus.Counter] // input, output
	tokensReported metricseries.Lazy[[2]prometheus.Counter] // input, output
}

// newGateSeries returns credential name's series of m; nil when m is nil.
func newGateSeries(m *Metrics, name string) *gateSeries {
	if m == nil {
		return nil
	}
	return &gateSeries{m: m, name: name}
}

// sources are the values of llmq_limiter_limit_source's source label, in gateSeries.limits' order.
var sources = [3]Source{SourceConfigured, SourceLearned, SourceUnknown}

func (g *gateSeries) reserved(r Reservation) {
	if g == nil {
		return
	}
	m, name := g.m, g.name
	limits := g.limits.Get(func() [5]prometheus.Gauge {
		return [5]prometheus.Gauge{m.rate.WithLabelValues(name), m.burst.WithLabelValues(name),
			m.source.WithLabelValues(name, string(sources[0])), m.source.WithLabelValues(name, string(sources[1])),
			m.source.WithLabelValues(name, string(sources[2]))}
	})
	limits[0].Set(r.Limit.Rate)
	limits[1].Set(float64(r.Limit.Burst))
	for i, s := range sources {
		v := 0.0
		if s == r.Source {
			v = 1
		}
		limits[2+i].Set(v)
	}
	if r.Granted {
		g.wait.Get(func() prometheus.Observer { return m.wait.WithLabelValues(name) }).Observe(max(r.Wait.Seconds(), 0))
	}
	if r.Probe {
		g.probes.Get(func() prometheus.Counter { return m.probes.WithLabelValues(name) }).Inc()
	}
	if r.Tokens != (TokenBuckets{}) {
		tl := g.tokenLimit.Get(func() [3]prometheus.Gauge {
			return [3]prometheus.Gauge{m.tokenLimit.WithLabelValues(name, string(tokens.BucketInput)),
				m.tokenLimit.WithLabelValues(name, string(tokens.BucketOutput)),
				m.tokenLimit.WithLabelValues(name, string(tokens.BucketTokens))}
		})
		tl[0].Set(r.Tokens.Input.PerMinute)
		tl[1].Set(r.Tokens.Output.PerMinute)
		tl[2].Set(r.Tokens.Combined.PerMinute)
	}
	if r.Granted && r.Grant > 0 {
		tr := g.tokensReserved.Get(func() [2]prometheus.Counter {
			return [2]prometheus.Counter{m.tokensReserved.WithLabelValues(name, "input"),
				m.tokensReserved.WithLabelValues(name, "output")}
		})
		tr[0].Add(float64(r.Cost.InputTokens))
		tr[1].Add(float64(r.Cost.OutputTokens))
	}
}

func (g *gateSeries) reconciled(actual tokens.Cost) {
	if g == nil {
		return
	}
	m, name := g.m, g.name
	tr := g.tokensReported.Get(func() [2]prometheus.Counter {
		return [2]prometheus.Counter{m.tokensReported.WithLabelValues(name, "input"),
			m.tokensReported.WithLabelValues(name, "output")}
	})
	tr[0].Add(float64(actual.InputTokens))
	tr[1].Add(float64(actual.OutputTokens))
}

func (g *gateSeries) pushedBack() {
	if g != nil {
		g.pushbacks.Get(func() prometheus.Counter { return g.m.pushbacks.WithLabelValues(g.name) }).Inc()
	}
}

func (g *gateSeries) refused() {
	if g != nil {
		g.refusals.Get(func() prometheus.Counter { return g.m.refusals.WithLabelValues(g.name) }).Inc()
	}
}

func (g *gateSeries) setPaused(paused bool) {
	if g == nil {
		return
	}
	v := 0.0
	if paused {
		v = 1
	}
	g.paused.Get(func() prometheus.Gauge { return g.m.paused.WithLabelValues(g.name) }).Set(v)
}
