package api

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/metricseries"
	"github.com/llmq/llmq/internal/tenant"
)

// Metrics are the API's Prometheus metrics. A nil *Metrics records nothing.
type Metrics struct {
	submits *prometheus.CounterVec
	// finished counts the jobs this API canceled: llmq_jobs_finished_total{status="canceled"}.
	// Workers count the jobs they end in the same metric; a job canceled with ctl is not
	// counted (ctl has no /metrics).
	finished *prometheus.CounterVec
	// submitStages is where a submit's time goes before its answer (SubmitStageCreate,
	// SubmitStageEnqueue).
	submitStages *prometheus.HistogramVec
	// responses counts every answer by route (the ServeMux pattern that matched: a bounded set,
	// never the path, which holds job IDs) and status code. Its 5xx share is the API failing
	// (the LLMQAPIServerErrors rule); nothing else counts those answers.
	responses *prometheus.CounterVec
	// tenantRefusals counts the 429s that refuse a tenant for its own excess, by tenant (""
	// for anonymous requests: see Server.overShare) and type.
	tenantRefusals *prometheus.CounterVec
	// openStreams is the event streams open on this replica (GET /v1/jobs/{id}/events), and
	// rejectedStreams those refused at its cap or their tenant's, by reason.
	openStreams     prometheus.Gauge
	rejectedStreams *prometheus.CounterVec
	// streamReadsWaiting is the streams' shared reads of jobs waiting for a turn (statusReads).
	streamReadsWaiting prometheus.Gauge
	// tokenLookupsRefused counts the requests answered 503 overloaded for want of a place among
	// the lookups of bearer tokens never known (tenant.ErrNewTokenLookupsFull).
	tokenLookupsRefused prometheus.Counter

	// submitSeries holds each credential's llmq_jobs_submitted_total series, and stageSeries
	// each stage's llmq_submit_stage_duration_seconds one, looked up once: the vectors' lookups
	// (a hash of the labels and a search under a lock) were ~2.6 k instructions of a job's (issue
	// 23). Each is made on its first use, as the lookup made it (see metricseries).
	submitSeries metricseries.Map[string, prometheus.Counter]
	stageSeries  [len(submitStages)]metricseries.Lazy[prometheus.Observer]
}

// Stages of a submit, the label values of llmq_submit_stage_duration_seconds. Both lie within
// the worker's pick-up stage (llmq_delivery_stage_duration_seconds{stage="pickup"}), which runs
// from the job's insert to its first delivery: they show how much of the pick-up is the API's.
const (
	// SubmitStageCreate: committing the new job and its first event to Postgres.
	SubmitStageCreate = "create"
	// SubmitStageEnqueue: handing the committed job's task to asynq and waking an idle worker, or
	// handing the job to this process's worker (llmq serve; Config.Handoff).
	SubmitStageEnqueue = "enqueue"
)

// submitStages are the stages of a submit, in stageSeries' order.
var submitStages = [...]string{SubmitStageCreate, SubmitStageEnqueue}

// NewMetrics registers the metrics on reg. llmq_jobs_finished_total may be there already, from
// the worker of the same process (llmq serve): the API then counts its cancels in that one. It
// panics if another metric is registered there already (a wiring bug).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		submits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_jobs_submitted_total", Help: "Jobs accepted by the API (replays not counted).",
		}, []string{"credential"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			// The worker's metric of the same name and help (executor.FinishedHelp); not imported,
			// since the API links no executor.
			Name: "llmq_jobs_finished_total", Help: "Jobs that reached a terminal status (canceled: counted by the API that canceled them).",
		}, []string{"credential", "status"}),
		submitStages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "llmq_submit_stage_duration_seconds",
			Help: "Time one submit of a new job spent in each stage before the API answered.",
			// The buckets of llmq_delivery_stage_duration_seconds (0.5 ms to 524 s), so that the
			// two can be read side by side.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 21),
		}, []string{"stage"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmq_http_responses_total",
			Help: "Answers of the API by route (the pattern that matched; / is any unknown path) and HTTP status code. " +
				"Connections refused at api.max_connections are not here (llmq_http_connections_rejected_total).",
		}, []string{"route", "code"}),
	}
	m.tenantRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmq_http_tenant_refusals_total",
		Help: "429s refusing a tenant for its own excess, by type (rate_limited, too_many_bodies, too_many_answers, too_many_submits, too_many_cancels, " +
			"too_many_streams) and tenant (empty for requests without a token).",
	}, []string{"tenant", "type"})
	m.openStreams = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "llmq_event_streams_open",
		Help: "Event streams (GET /v1/jobs/{id}/events) open on this API process; api.max_streams caps them.",
	})
	m.rejectedStreams = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "llmq_event_streams_rejected_total",
		Help: "Event streams refused: reason server, the process held api.max_streams (503); tenant, the tenant held api.max_streams_per_tenant (429).",
	}, []string{"reason"})
	m.streamReadsWaiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "llmq_event_stream_reads_waiting",
		Help: "Event streams' reads of their jobs (one per job, shared by its streams) waiting for a turn: a quarter of the " +
			"Postgres pool's connections read at once. Many jobs ending together queue here; it stays high when Postgres is slow.",
	})
	m.tokenLookupsRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "llmq_http_token_lookups_refused_total",
		Help: "Requests answered 503 overloaded because the Postgres lookups of bearer tokens this process never knew as a tenant's " +
			"(made-up tokens; a new or rotated token's first request) held their share of the pool (a quarter) for the whole wait.",
	})
	reg.MustRegister(m.submits, m.submitStages, m.responses, m.tenantRefusals, m.openStreams, m.rejectedStreams, m.streamReadsWaiting,
		m.tokenLookupsRefused)
	if err := reg.Register(m.finished); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			panic(err)
		}
		m.finished = are.ExistingCollector.(*prometheus.CounterVec)
	}
	return m
}

// initCredentials gives each credential's series a 0 at start, so that the first submit or
// cancel after a start shows in rate() and increase().
func (m *Metrics) initCredentials(names []string) {
	if m == nil {
		return
	}
	for _, name := range names {
		m.submits.WithLabelValues(name)
		m.finished.WithLabelValues(name, string(jobs.StatusCanceled))
	}
	for i := range submitStages {
		m.stageObserver(i)
	}
	m.rejectedStreams.WithLabelValues(streamsRejectedServer)
	m.rejectedStreams.WithLabelValues(streamsRejectedTenant)
}

// streamsOpen sets the number of open event streams.
func (m *Metrics) streamsOpen(n int) {
	if m != nil {
		m.openStreams.Set(float64(n))
	}
}

// streamReadWaits adds delta (1 or -1) to the streams' reads waiting for a turn.
func (m *Metrics) streamReadWaits(delta float64) {
	if m != nil {
		m.streamReadsWaiting.Add(delta)
	}
}

// streamRejected counts an event stream refused for reason (streamsRejectedServer, ...Tenant).
func (m *Metrics) streamRejected(reason string) {
	if m != nil {
		m.rejectedStreams.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) submitted(credential string) {
	if m == nil {
		return
	}
	m.submitSeries.Get(credential, func(credential string) prometheus.Counter {
		return m.submits.WithLabelValues(credential)
	}).Inc()
}

func (m *Metrics) refusedOverShare(tenant, typ string) {
	if m != nil {
		m.tenantRefusals.WithLabelValues(tenant, typ).Inc()
	}
}

// forgetTenant drops the deleted tenant's series (llmq_http_tenant_refusals_total): a deleted
// tenant's were kept until the process restarted. A tenant of the name created later starts
// its series again.
func (m *Metrics) forgetTenant(name string) {
	if m != nil {
		m.tenantRefusals.DeletePartialMatch(prometheus.Labels{"tenant": name})
	}
}

// listenerFuncs are the notifications beside the jobs' that an API process's Listener hands on
// (jobs.ListenerConfig.ChannelFuncs): a tenant's deletion (tenant.DeletedChannel) drops its
// series.
func (m *Metrics) listenerFuncs() map[string]func(payload string) {
	return map[string]func(string){tenant.DeletedChannel: m.forgetTenant}
}

func (m *Metrics) refusedTokenLookup() {
	if m != nil {
		m.tokenLookupsRefused.Inc()
	}
}

func (m *Metrics) canceled(credential string) {
	if m != nil {
		m.finished.WithLabelValues(credential, string(jobs.StatusCanceled)).Inc()
	}
}

// serverErrorCodes are the 5xx codes the API answers (writeError's 500 and 503), whose series
// start at 0 for each route (see instrument).
var serverErrorCodes = []string{"500", "503"}

// instrument counts each answer of h, the handler of route, in llmq_http_responses_total, whose
// 5xx series for route it creates at 0 (so that the first after a start is an increase). A
// panic in h (but http.ErrAbortHandler, left to net/http) is logged once on logger with its
// stack and counted as a 500: answered 500 internal when no answer had begun, the connection
// cut when one had (net/http alone would cut it either way, and count nothing). The
// ResponseWriter h gets unwraps to the server's (http.ResponseController: flushes, write
// deadlines); see rootWriter. On a nil *Metrics it counts nothing, and still recovers.
func (m *Metrics) instrument(route string, h http.Handler, logger *slog.Logger) http.Handler {
	var codes *prometheus.CounterVec
	if m != nil {
		for _, code := range serverErrorCodes {
			m.responses.WithLabelValues(route, code)
		}
		codes = m.responses.MustCurryWith(prometheus.Labels{"route": route})
	}
	// series is the route's series by status code, looked up in the vector once per code (issue
	// 23: a lookup per answer hashed the labels and searched under a lock). A route answers a
	// handful of codes.
	var series metricseries.Map[int, prometheus.Counter]
	codeSeries := func(status int) prometheus.Counter { return codes.WithLabelValues(strconv.Itoa(status)) }
	count := func(status int) {
		if codes != nil {
			series.Get(status, codeSeries).Inc()
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				count(cmp.Or(sw.status, http.StatusOK))
				return
			}
			if v == http.ErrAbortHandler { // net/http compares it so too
				panic(v)
			}
			logger.ErrorContext(r.Context(), "panic in a handler", "method", r.Method, "path", r.URL.Path,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			count(http.StatusInternalServerError)
			if sw.status != 0 {
				panic(http.ErrAbortHandler) // an answer begun: cut it rather than end it as if whole
			}
			writeError(sw, r, logger, &httpError{status: http.StatusInternalServerError, typ: "internal", message: "internal error"})
		}()
		h.ServeHTTP(sw, r)
	})
}

// statusWriter keeps the status of the answer written through it (0: none begun yet).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 { // a 1xx is not the answer
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// Unwrap is the server's writer (http.ResponseController, rootWriter).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// rootWriter is the ResponseWriter the server gave, under those that wrap it (instrument's, and
// tests' recorders). http.MaxBytesReader needs that one: only it can close the connection after
// the answer to a body over the limit, rather than read on through the rest of the body.
func rootWriter(w http.ResponseWriter) http.ResponseWriter {
	for {
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return w
		}
		w = u.Unwrap()
	}
}

// submitStage records that a submit spent d in stage (SubmitStageCreate, SubmitStageEnqueue).
func (m *Metrics) submitStage(stage string, d time.Duration) {
	if m == nil {
		return
	}
	switch stage {
	case SubmitStageCreate:
		m.stageObserver(0).Observe(d.Seconds())
	case SubmitStageEnqueue:
		m.stageObserver(1).Observe(d.Seconds())
	default:
		m.submitStages.WithLabelValues(stage).Observe(d.Seconds())
	}
}

// stageObserver is the series of submitStages[i], made on its first use.
func (m *Metrics) stageObserver(i int) prometheus.Observer {
	return m.stageSeries[i].Get(func() prometheus.Observer { return m.submitStages.WithLabelValues(submitStages[i]) })
}
