package dispatch

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are dispatch's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	swept prometheus.Counter
	// lastSweep is when the last pass that succeeded in this process started: a sweeper whose
	// passes fail or stall, or no sweeping process at all, shows as a time that stops moving
	// in every process (the LLMQSweeperStalled rule).
	lastSweep prometheus.Gauge
	// sweepFailures counts the passes that failed, by the store that failed them (sweepStores).
	sweepFailures *prometheus.CounterVec
	idleWaits     *prometheus.CounterVec
	handoffs      *prometheus.CounterVec
	// idleWaitsBy and handoffsBy are the vectors' series by label value, made with the metrics
	// and only read after: each job counts a hand-over or an idle wait, spared the vector's lookup.
	idleWaitsBy map[string]prometheus.Counter
	handoffsBy  map[string]prometheus.Counter
	// deliveryErrors counts the deliveries that failed (see ServerConfig.Metrics): asynq retries
	// them and logs nothing, so without it a worker whose stores fail on every job is silent.
	deliveryErrors prometheus.Counter
}

// NewMetrics registers the metrics on reg. It panics if they are registered there already (a
// wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "llmq_sweeper_reenqueued_total", Help: "Jobs whose asynq task was missing and was enqueued again.",
		}),
		lastSweep: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "llmq_sweeper_last_success_timestamp_seconds",
			Help: "Start (Unix time) of the last sweep that succeeded in this process while it led the sweeper; 0: none yet. " +
				"The max over the workers is the leader's.",
		}),
		sweepFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_sweeper_pass_failures_total",
			Help: "Sweeps that failed in this process while it led the sweeper, by the store " +
				"that failed them: postgres or redis. Each gives the lead up; the next try comes " +
				"one interval later.",
		}, []string{"store"}),
		idleWaits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_worker_idle_waits_total",
			Help: "Waits of an idle worker for a task, by what ended them: a wake-up (a task enqueued, or moved to pending " +
				"by asynq) or the poll interval. Only polls while jobs flow: the wake-ups are not arriving.",
		}, []string{"ended"}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_worker_handoffs_total",
			Help: "Jobs submitted to this process's API (llmq serve) by what became of their first delivery: taken " +
				"(run in this process, with no asynq task), declined (a new job, low or offered while every slot was taken or " +
				"the process shut down: enqueued as a task), returned (taken, then handed to asynq: a deferral, a failure of the stores, a shutdown).",
		}, []string{"outcome"}),
	}
	m.deliveryErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "llmq_delivery_errors_total",
		Help: "Deliveries of a job's task that ended in an error (the stores failing: Postgres or Redis unreachable or " +
			"refusing, a task timeout), handed back to asynq to retry with backoff. Deferrals and cancels are not counted.",
	})
	m.idleWaitsBy = map[string]prometheus.Counter{}
	for _, ended := range []string{waitEndedByWakeUp, waitEndedByPoll} {
		m.idleWaitsBy[ended] = m.idleWaits.WithLabelValues(ended)
	}
	m.handoffsBy = map[string]prometheus.Counter{}
	for _, outcome := range []string{handoffTaken, handoffDeclined, handoffReturned} {
		m.handoffsBy[outcome] = m.handoffs.WithLabelValues(outcome)
	}
	for _, store := range []string{storePostgres, storeRedis} {
		m.sweepFailures.WithLabelValues(store)
	}
	reg.MustRegister(m.swept, m.lastSweep, m.sweepFailures, m.idleWaits, m.handoffs,
		m.deliveryErrors)
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

// counter is v's series of label value lv: from by when it is there, else v's lookup.
func counter(by map[string]prometheus.Counter, v *prometheus.CounterVec, lv string) prometheus.Counter {
	if c, ok := by[lv]; ok {
		return c
	}
	return v.WithLabelValues(lv)
}

func (m *Metrics) handoff(outcome string) {
	if m != nil {
		counter(m.handoffsBy, m.handoffs, outcome).Inc()
	}
}

func (m *Metrics) idleWaitEnded(by string) {
	if m != nil {
		counter(m.idleWaitsBy, m.idleWaits, by).Inc()
	}
}

func (m *Metrics) sweptOne() {
	if m != nil {
		m.swept.Inc()
	}
}

// sweepSucceeded records that a sweep that started at start succeeded.
func (m *Metrics) sweepSucceeded(start time.Time) {
	if m != nil {
		m.lastSweep.Set(float64(start.UnixNano()) / 1e9)
	}
}

// sweepFailed counts a sweep that failed on store (storePostgres or storeRedis).
func (m *Metrics) sweepFailed(store string) {
	if m != nil {
		m.sweepFailures.WithLabelValues(store).Inc()
	}
}

// deliveryFailed counts a delivery that ended in an error.
func (m *Metrics) deliveryFailed() {
	if m != nil {
		m.deliveryErrors.Inc()
	}
}
