package executor

import (
	"errors"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/metricseries"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// Metrics are the executor's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	attempts       *prometheus.CounterVec
	attemptLatency *prometheus.HistogramVec
	outcomes       *prometheus.CounterVec
	deadLetters    *prometheus.CounterVec
	submitToResult *prometheus.HistogramVec
	stages         *prometheus.HistogramVec
	// deferrals counts the deliveries from asynq that were deferred: each comes back at its time
	// and reads its job again (the load stage), so LLMQDeliveryErrors leaves them out of the
	// deliveries it divides by.
	deferrals prometheus.Counter
	// shareDeferrals counts, by tenant, the deliveries deferred because their tenant held its
	// share of the process's delivery slots (Config.Slots); counted in deferrals too.
	shareDeferrals *prometheus.CounterVec

	// creds holds each configured credential's series, looked up once (see metricseries): a
	// job's attempt and end set four, and the vectors' lookups (a hash of the labels and a
	// search under a lock) were ~1% of a job's instructions with the limiter's
	// (docs/benchmarks.md). Only the names initCredentials is given are kept, so a credential
	// name from elsewhere (a job of a removed credential) is looked up as before and grows
	// nothing. stageSeries is each stage's series, made on its first use as the lookup did.
	creds       metricseries.Map[string, *credSeries]
	stageSeries [len(stages)]metricseries.Lazy[prometheus.Observer]
}

// stages are the stages of a delivery, in stageSeries' order.
var stages = [...]string{StagePickup, StageLoad, StageBreaker, StageAdmit, StageBegin, StageCall, StageBookkeeping, StageRecord}

// credSeries is one credential's series of the executor's metrics. The counters are those
// initCredentials makes; the histograms are made on their first observation, as a lookup made
// them, so that a process exports the same series.
type credSeries struct {
	attempts  map[string]prometheus.Counter      // by class
	outcomes  map[jobs.Status]prometheus.Counter // by terminal status
	latency   metricseries.Lazy[prometheus.Observer]
	durations [len(finalStatuses)]metricseries.Lazy[prometheus.Observer] // by finalStatuses' index
}

// finalStatuses are the statuses a worker ends a job in (llmq_jobs_finished_total's).
var finalStatuses = [...]jobs.Status{jobs.StatusSucceeded, jobs.StatusFailed, jobs.StatusDead}

// series returns credential's series; nil when initCredentials was not given its name.
func (m *Metrics) series(credential string) *credSeries {
	cs, _ := m.creds.Load(credential)
	return cs
}

// Stages of a delivery, the label values of llmq_delivery_stage_duration_seconds. A delivery
// that ends early (a terminal job, a deferral) records the stages it ran.
const (
	// StagePickup: the job's creation to the start of its first delivery (the API's commit and
	// enqueue, and asynq's pick-up); first attempts only.
	StagePickup = "pickup"
	// StageLoad: reading the job row.
	StageLoad = "load"
	// StageBreaker: the circuit breaker's admission, with any short wait on it (and, for a low
	// job's delivery, the wait for a place in the backlog gate after such a wait). Not recorded
	// when the limiter's reservation made the breaker's test and it admitted (a closed, warm
	// breaker: the admit stage's one round trip).
	StageBreaker = "breaker"
	// StageAdmit: the limiter's admission (pause, retry budget, rate slot), with its inline wait.
	StageAdmit = "admit"
	// StageBegin: recording the attempt's start and taking its lease.
	StageBegin = "begin"
	// StageCall: the provider call.
	StageCall = "call"
	// StageBookkeeping: telling the limiter and the breaker what the call showed.
	StageBookkeeping = "bookkeeping"
	// StageRecord: storing the attempt and the job's outcome.
	StageRecord = "record"
)

// FinishedHelp is the help of llmq_jobs_finished_total, which two processes export: workers
// count the jobs they end, the API the jobs it cancels.
const FinishedHelp = "Jobs that reached a terminal status (canceled: counted by the API that canceled them)."

// NewMetrics registers the metrics on reg. llmq_jobs_finished_total may be there already, from
// the API of the same process (llmq serve): the worker then counts in that one. It panics if
// another metric is registered there already (a wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_attempts_total", Help: "Provider calls by outcome class.",
		}, []string{"credential", "class"}),
		attemptLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmq_attempt_duration_seconds", Help: "Latency of one provider call.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}, []string{"credential"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_jobs_finished_total", Help: FinishedHelp,
		}, []string{"credential", "status"}),
		deadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_dead_letters_total", Help: "Jobs dead-lettered, by reason.",
		}, []string{"credential", "reason"}),
		submitToResult: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmq_job_duration_seconds", Help: "Submit to terminal status, retries and waits included: the latency the user sees.",
			// 50 ms to 29 h: a job lives up to its timeout (at most 24h), or longer when an
			// operator retries it dead (its submit stays its own).
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 22),
		}, []string{"credential", "status"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmq_delivery_stage_duration_seconds",
			Help: "Time one delivery of a job spent in each stage: where a job's latency goes.",
			// 0.5 ms to 524 s: the store's round trips at the bottom, provider calls (up to
			// attempt_timeout, 5m by default) and pick-up from a backlog at the top. The API's
			// llmq_submit_stage_duration_seconds has the same.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 21),
		}, []string{"stage"}),
		deferrals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_delivery_deferrals_total",
			Help: "Deliveries of a job's task that were deferred (its rate slot, its retry delay, an open breaker, a pause): " +
				"the task is delivered again at its time, and reads its job again (the load stage).",
		}),
		shareDeferrals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_delivery_share_deferrals_total",
			Help: "Deliveries deferred because their tenant held its share of the worker's delivery slots, by tenant.",
		}, []string{"tenant"}),
	}
	reg.MustRegister(m.attempts, m.attemptLatency, m.deadLetters, m.submitToResult, m.stages, m.deferrals,
		m.shareDeferrals)
	if err := reg.Register(m.outcomes); err != nil {
		// The API of the same process (llmq serve) registered it first: count in that one.
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err)
		}
		m.outcomes = are.ExistingCollector.(*prometheus.CounterVec)
	}
	return m
}

// initCredentials gives every series the alerting rules read a 0 for each credential, so that
// the first attempt, outcome or dead letter after a start is an increase (a series that first
// appears at 1 shows no increase, and its alert never fires).
func (m *Metrics) initCredentials(names []string) {
	if m == nil {
		return
	}
	classes := []retrypolicy.Class{retrypolicy.ClassOK, retrypolicy.ClassRetryable, retrypolicy.ClassRateLimited,
		retrypolicy.ClassSpendCap, retrypolicy.ClassTimeout, retrypolicy.ClassNetwork, retrypolicy.ClassPermanent,
		retrypolicy.ClassInternal, retrypolicy.ClassCanceled}
	for _, name := range names {
		m.creds.Get(name, func(name string) *credSeries { // a second executor on the same metrics keeps the first's
			cs := &credSeries{attempts: make(map[string]prometheus.Counter, len(classes)),
				outcomes: make(map[jobs.Status]prometheus.Counter, len(finalStatuses))}
			for _, c := range classes {
				cs.attempts[string(c)] = m.attempts.WithLabelValues(name, string(c))
			}
			for _, st := range finalStatuses {
				cs.outcomes[st] = m.outcomes.WithLabelValues(name, string(st))
			}
			return cs
		})
		for _, reason := range jobs.DeadReasons() {
			m.deadLetters.WithLabelValues(name, reason)
		}
	}
}

func (m *Metrics) attempt(credential, class string, latency time.Duration) {
	if m == nil {
		return
	}
	cs := m.series(credential)
	if cs == nil {
		m.attempts.WithLabelValues(credential, class).Inc()
		m.attemptLatency.WithLabelValues(credential).Observe(latency.Seconds())
		return
	}
	if c, ok := cs.attempts[class]; ok {
		c.Inc()
	} else {
		m.attempts.WithLabelValues(credential, class).Inc()
	}
	cs.latency.Get(func() prometheus.Observer { return m.attemptLatency.WithLabelValues(credential) }).Observe(latency.Seconds())
}

// Finished records that a job of credential reached final status (with deadReason when dead)
// sinceSubmit after it was submitted: llmq_jobs_finished_total, llmq_job_duration_seconds and
// llmq_dead_letters_total. The executor calls it for the jobs it ends; the workers' deadline pass
// (internal/maintenance) for those it fails. Safe for concurrent use, and on a nil *Metrics.
func (m *Metrics) Finished(credential string, status jobs.Status, deadReason string, sinceSubmit time.Duration) {
	if m == nil {
		return
	}
	outcome, duration := m.finishedSeries(credential, status)
	outcome.Inc()
	duration.Observe(sinceSubmit.Seconds())
	if status == jobs.StatusDead {
		m.DeadLettered(credential, deadReason)
	}
}

// finishedSeries returns the series Finished counts a job of credential ended in status in.
func (m *Metrics) finishedSeries(credential string, status jobs.Status) (prometheus.Counter, prometheus.Observer) {
	cs := m.series(credential)
	i := slices.Index(finalStatuses[:], status)
	if cs == nil || i < 0 {
		return m.outcomes.WithLabelValues(credential, string(status)),
			m.submitToResult.WithLabelValues(credential, string(status))
	}
	return cs.outcomes[status], cs.durations[i].Get(func() prometheus.Observer {
		return m.submitToResult.WithLabelValues(credential, string(status))
	})
}

// DeadLettered counts a dead letter of credential in llmq_dead_letters_total. Finished calls it
// for the jobs the executor ends; the batch lane (internal/batchlane), which keeps its jobs'
// other counts apart (llmq_batch_jobs_total), for its own. Safe for concurrent use, and on a
// nil *Metrics.
func (m *Metrics) DeadLettered(credential, reason string) {
	if m != nil {
		m.deadLetters.WithLabelValues(credential, reason).Inc()
	}
}

// stage records that a delivery spent d in stage.
func (m *Metrics) stage(stage string, d time.Duration) {
	if m == nil {
		return
	}
	i := slices.Index(stages[:], stage)
	if i < 0 {
		m.stages.WithLabelValues(stage).Observe(d.Seconds())
		return
	}
	m.stageSeries[i].Get(func() prometheus.Observer { return m.stages.WithLabelValues(stage) }).Observe(d.Seconds())
}

// deferred counts a delivery from asynq that was deferred.
func (m *Metrics) deferred() {
	if m != nil {
		m.deferrals.Inc()
	}
}

// shareDeferred counts a delivery of tenant deferred over its share of the slots.
func (m *Metrics) shareDeferred(tenant string) {
	if m != nil {
		m.shareDeferrals.WithLabelValues(tenant).Inc()
	}
}
