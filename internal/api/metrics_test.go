package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/openapitest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestMetrics_CanceledJobsAreCountedFromZero: the API cancels, so it counts the canceled jobs in
// llmq_jobs_finished_total, whose series, like the submits', exist at 0 from the start.
func TestMetrics_CanceledJobsAreCountedFromZero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, setupOpts{registry: reg, credentials: []string{"default", "other"}})
	const head = `# HELP llmq_jobs_finished_total Jobs that reached a terminal status (canceled: counted by the API that canceled them).
# TYPE llmq_jobs_finished_total counter
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+`llmq_jobs_finished_total{credential="default",status="canceled"} 0
llmq_jobs_finished_total{credential="other",status="canceled"} 0
`), "llmq_jobs_finished_total"))
	n, err := testutil.GatherAndCount(reg, "llmq_jobs_submitted_total")
	require.NoError(t, err)
	require.Equal(t, 2, n, "a 0 per credential")

	r := b.do(t, http.MethodPost, "/v1/jobs", `{"credential":"other","request":{"model":"m"}}`, nil)
	require.Equal(t, http.StatusAccepted, r.status)
	id := r.body["id"].(string)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil).status)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil).status, "canceled before: counted once")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(head+`llmq_jobs_finished_total{credential="default",status="canceled"} 0
llmq_jobs_finished_total{credential="other",status="canceled"} 1
`), "llmq_jobs_finished_total"))
}

// TestMetrics_SubmitStages: a new job's submit records the time of its commit and of its enqueue,
// from a 0 at start; a replay records nothing. The API's clock here reads the stores: a second
// per job row, a minute per queued task, so each stage's time shows what happened within it.
func TestMetrics_SubmitStages(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	rdb := redistest.Client(t)
	var b *testBundle
	base := time.Unix(1_700_000_000, 0)
	now := func() time.Time { // called on the server's goroutines: t.Errorf, not require
		if b == nil {
			return base // setup itself
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var rows int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&rows); err != nil {
			t.Errorf("count jobs: %v", err)
		}
		tasks, err := rdb.LLen(ctx, "asynq:{"+b.queue+"}:pending").Result()
		if err != nil {
			t.Errorf("count tasks: %v", err)
		}
		return base.Add(time.Duration(rows)*time.Second + time.Duration(tasks)*time.Minute)
	}
	b = setup(t, setupOpts{registry: reg, now: now})
	stages := func() map[string][2]float64 { // stage → count, sum (seconds)
		t.Helper()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		out := map[string][2]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "llmq_submit_stage_duration_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				h := m.GetHistogram()
				out[m.GetLabel()[0].GetValue()] = [2]float64{float64(h.GetSampleCount()), h.GetSampleSum()}
			}
		}
		return out
	}
	require.Equal(t, map[string][2]float64{SubmitStageCreate: {0, 0}, SubmitStageEnqueue: {0, 0}}, stages(), "both series from the start")

	key := map[string]string{"Idempotency-Key": "stages-1"}
	for range 2 {
		require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, nil).status)
	}
	require.Equal(t, http.StatusAccepted, b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, key).status)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, key).status, "a replay")
	got := stages()
	require.Equal(t, float64(3), got[SubmitStageCreate][0], "one per new job, none for the replay")
	require.Equal(t, float64(3), got[SubmitStageEnqueue][0])
	require.InDelta(t, 3.0, got[SubmitStageCreate][1], 1e-9, "each create's time holds its row's insert, not its task")
	require.InDelta(t, 180.0, got[SubmitStageEnqueue][1], 1e-9, "each enqueue's time holds its task, not its row")
}

// TestMetrics_EveryScrapeFormatIsDocumented: /metrics answers in the format a scraper asks for
// (promhttp's negotiation): the text format by default, the protobuf one to a Prometheus that
// scrapes native histograms. Each answer must be one api/openapi.yaml describes (setup checks).
func TestMetrics_EveryScrapeFormatIsDocumented(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, setupOpts{registry: reg})
	for accept, want := range map[string]string{
		"": "text/plain",
		// As a Prometheus that scrapes native histograms asks (scrape_protocols led by
		// PrometheusProto).
		"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.6," +
			"application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1": "application/vnd.google.protobuf",
	} {
		h := map[string]string{}
		if accept != "" {
			h["Accept"] = accept
		}
		r := b.do(t, http.MethodGet, "/metrics", "", h)
		require.Equal(t, http.StatusOK, r.status)
		require.True(t, strings.HasPrefix(r.header.Get("Content-Type"), want), "Accept %q: Content-Type %q", accept, r.header.Get("Content-Type"))
	}
}

// TestMetrics_ResponsesByRouteAndCode: every answer is counted in llmq_http_responses_total by
// its route's pattern (never the path, which holds a job ID) and status code, so that an
// operator can alert on the 5xx share (LLMQAPIServerErrors). The 5xx series an API gives exist
// at 0 from the start, so that the first one after a start is an increase. Here the job store
// and Redis are unreachable: each route that reads them answers 503.
func TestMetrics_ResponsesByRouteAndCode(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	s := New(Config{Store: jobs.NewStore(pool, nil), Pool: pool, Redis: rdb, AllowAnonymous: true,
		Submit: SubmitConfig{Credentials: []string{"default"}}, Metrics: NewMetrics(reg), Gatherer: reg})
	hs := httptest.NewServer(openapitest.Handler(t, s))
	t.Cleanup(hs.Close)
	want := map[string]float64{"/ 500": 0, "/ 503": 0} // the catch-all's: unknown paths
	for _, rt := range s.routes {
		want[rt.pattern+" 500"], want[rt.pattern+" 503"] = 0, 0
	}
	require.Equal(t, want, responses(t, reg), "each route's 5xx series, at 0")

	const id = "0190a5b2-7c1e-7d3f-9a8b-123456789abc"
	for _, r := range []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/v1/jobs/" + id, http.StatusServiceUnavailable},
		{http.MethodHead, "/v1/jobs/" + id, http.StatusServiceUnavailable},
		{http.MethodDelete, "/v1/jobs/" + id, http.StatusServiceUnavailable},
		{http.MethodPost, "/v1/jobs", http.StatusServiceUnavailable},
		{http.MethodGet, "/readyz", http.StatusServiceUnavailable},
		{http.MethodGet, "/healthz", http.StatusOK},
		{http.MethodPut, "/healthz", http.StatusMethodNotAllowed},
		{http.MethodGet, "/v2/anything", http.StatusNotFound},
	} {
		body := ""
		if r.method == http.MethodPost {
			body = `{"request":{"model":"m"}}`
		}
		require.Equal(t, r.status, do(t, hs.URL, r.method, r.path, body, nil).status, "%s %s", r.method, r.path)
	}
	want["/v1/jobs/{id} 503"] = 3
	want["/v1/jobs 503"] = 1
	want["/readyz 503"] = 1
	want["/healthz 200"] = 1
	want["/healthz 405"] = 1
	want["/ 404"] = 1
	require.Equal(t, want, responses(t, reg))
}

// TestMetrics_CountedEventStreamsStillStream: the count of answers wraps each route's
// ResponseWriter; an event stream must still flush each event as it comes (and set its write
// deadlines), and is counted once it ends.
func TestMetrics_CountedEventStreamsStillStream(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, setupOpts{registry: reg})
	job := b.create(t, "")
	s := openStream(t, b.url, job.ID, "")
	require.Equal(t, "queued", s.nextEvent(t).event, "the first event, while the stream is open")
	_, err := b.store.Cancel(context.Background(), job.ID)
	require.NoError(t, err)
	s.rest(t)
	s.close()
	require.Equal(t, float64(1), responses(t, reg)["/v1/jobs/{id}/events 200"])
}

// responses returns llmq_http_responses_total's counts in reg by "route code".
func responses(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "llmq_http_responses_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["route"]+" "+l["code"]] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestMetrics_OversizeBodyStillClosesTheConnection: a submit body found over api.max_body_bytes
// as it is read is answered 413 and its connection closed, the rest of the body unread, through the counting
// wrapper too (http.MaxBytesReader can tell only the server's own ResponseWriter).
func TestMetrics_OversizeBodyStillClosesTheConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{registry: prometheus.NewRegistry(), maxBody: 1024})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Chunked (a reader of unknown length): a Content-Length over the limit is refused before
	// the body is read.
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url+"/v1/jobs",
		io.MultiReader(strings.NewReader(`{"request":{"m":"`+strings.Repeat("x", 4096)+`"}}`)))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.True(t, resp.Close, "Connection: close")
}

// TestMetrics_PerJobSeriesAreKept: a submit's series (its credential's submits, its two stages)
// and an answer's (its route and code) are looked up in their vectors once, not per job (issue
// 23: the lookups hashed the labels and searched under a lock, and allocated), and still count
// where the lookups did, a credential never configured and a code never answered included.
func TestMetrics_PerJobSeriesAreKept(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.initCredentials([]string{"primary"})
	h := m.instrument("POST /v1/jobs", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
	}), slog.New(slog.DiscardHandler))
	w := &discardWriter{header: http.Header{}}
	r := httptest.NewRequest(http.MethodPost, "/v1/jobs", nil)
	job := func() {
		m.submitStage(SubmitStageCreate, time.Millisecond)
		m.submitted("primary")
		m.submitStage(SubmitStageEnqueue, time.Millisecond)
		w.status = 0
		h.ServeHTTP(w, r)
	}
	job() // the first answer of a code makes its series
	allocs := testing.AllocsPerRun(50, job)
	require.LessOrEqual(t, allocs, 1.0, "allocations per job's metrics (the instrument's statusWriter's 1)")
	m.submitted("unconfigured")
	m.submitted("unconfigured")
	require.Equal(t, 52.0, testutil.ToFloat64(m.submits.WithLabelValues("primary")))
	require.Equal(t, 2.0, testutil.ToFloat64(m.submits.WithLabelValues("unconfigured")))
	require.Equal(t, 52.0, testutil.ToFloat64(m.responses.WithLabelValues("POST /v1/jobs", "202")))
	require.Equal(t, 2, testutil.CollectAndCount(m.submitStages))
	m.submitStage("other", time.Millisecond) // not a stage of ours: looked up as before
	require.Equal(t, 3, testutil.CollectAndCount(m.submitStages))
}

// discardWriter is a ResponseWriter that keeps nothing but a status, allocating nothing.
type discardWriter struct {
	header http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.header }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
