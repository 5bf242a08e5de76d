package api

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

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
	require.Equal(t, http.StatusConflict, b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil).status, "counted once")
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
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
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
