package main

import (
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/executor"
)

// stageWorker is a stand-in for a worker's registry: the stage histogram alone.
func stageWorker(t *testing.T) (*prometheus.Registry, *prometheus.HistogramVec, string) {
	t.Helper()
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: stageMetric}, []string{"stage"})
	reg.MustRegister(h)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return reg, h, strings.TrimPrefix(srv.URL, "http://")
}

// The stages of the measured jobs are the difference of two readings summed over the workers,
// whether read from a registry or scraped.
func TestStageTimes(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	regA, a, addrA := stageWorker(t)
	_, b, addrB := stageWorker(t)
	a.WithLabelValues(executor.StageCall).Observe(10) // before the measured jobs
	before, err := scrapeStageTotals(ctx, http.DefaultClient, []string{addrA, addrB})
	require.NoError(t, err)

	a.WithLabelValues(executor.StagePickup).Observe(0.004)
	b.WithLabelValues(executor.StagePickup).Observe(0.002)
	a.WithLabelValues(executor.StageCall).Observe(0.001)
	b.WithLabelValues(executor.StageCall).Observe(0.003)
	b.WithLabelValues(executor.StageLoad).Observe(0.001)
	b.WithLabelValues(executor.StageLoad).Observe(0.003)
	after, err := scrapeStageTotals(ctx, http.DefaultClient, []string{addrA, addrB})
	require.NoError(t, err)

	got := stageTimes(before, after)
	require.Len(t, got, 3, "stages without deliveries are left out")
	require.Equal(t, []string{executor.StagePickup, executor.StageLoad, executor.StageCall},
		[]string{got[0].stage, got[1].stage, got[2].stage}, "in the order a delivery runs them")
	for _, st := range got {
		require.Equal(t, uint64(2), st.count, st.stage)
		require.InDelta(t, map[string]float64{executor.StagePickup: 3, executor.StageLoad: 2, executor.StageCall: 2}[st.stage], st.meanMS, 1e-9, st.stage)
	}
	require.Equal(t, "stage mean ms per delivery: pickup 3.00, load 2.00, call 2.00 (7.0 ms per job in all)", stagesLine(got, 2))
	require.Empty(t, stagesLine(nil, 2))

	// And a registry read in process gives the same totals as its scrape
	mfs, err := regA.Gather()
	require.NoError(t, err)
	inProcess := map[string]stageTotal{}
	addStageTotals(inProcess, mfs)
	scraped, err := scrapeStageTotals(ctx, http.DefaultClient, []string{addrA})
	require.NoError(t, err)
	require.Equal(t, scraped, inProcess)
}

// A worker that cannot be scraped is an error naming it, not zero stages.
func TestScrapeStageTotals_Unreachable(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	_, err := scrapeStageTotals(t.Context(), http.DefaultClient, []string{addr})
	require.ErrorContains(t, err, "scrape "+addr)
}

// The API's submit stages are read from its own /metrics beside the workers' delivery stages,
// listed after them and left out of the delivery stages' sum: they lie within the pick-up.
func TestStageTimes_SubmitStages(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, worker, workerAddr := stageWorker(t)
	apiReg := prometheus.NewRegistry()
	submit := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: submitStageMetric}, []string{"stage"})
	apiReg.MustRegister(submit)
	apiSrv := httptest.NewServer(promhttp.HandlerFor(apiReg, promhttp.HandlerOpts{}))
	t.Cleanup(apiSrv.Close)
	addrs := []string{workerAddr, strings.TrimPrefix(apiSrv.URL, "http://")}
	before, err := scrapeStageTotals(ctx, http.DefaultClient, addrs)
	require.NoError(t, err)

	for range 2 {
		worker.WithLabelValues(executor.StagePickup).Observe(0.003)
		worker.WithLabelValues(executor.StageCall).Observe(0.001)
		submit.WithLabelValues(api.SubmitStageCreate).Observe(0.0015)
		submit.WithLabelValues(api.SubmitStageEnqueue).Observe(0.0005)
	}
	after, err := scrapeStageTotals(ctx, http.DefaultClient, addrs)
	require.NoError(t, err)

	got := stageTimes(before, after)
	require.Equal(t, []stageTime{
		{stage: executor.StagePickup, count: 2, meanMS: 3},
		{stage: executor.StageCall, count: 2, meanMS: 1},
		{stage: api.SubmitStageCreate, count: 2, meanMS: 1.5, submit: true},
		{stage: api.SubmitStageEnqueue, count: 2, meanMS: 0.5, submit: true},
	}, roundedStages(got))
	require.Equal(t, "stage mean ms per delivery: pickup 3.00, call 1.00 (4.0 ms per job in all); "+
		"of the pick-up, the API's submit stages, mean ms per job: create 1.50, enqueue 0.50", stagesLine(got, 2))
	require.Equal(t, "of the pick-up, the API's submit stages, mean ms per job: create 1.50, enqueue 0.50",
		stagesLine(got[2:], 2), "submit stages alone")
}

// roundedStages rounds the means to µs, so that float sums of histogram samples compare exactly.
func roundedStages(stages []stageTime) []stageTime {
	out := slices.Clone(stages)
	for i := range out {
		out[i].meanMS = math.Round(out[i].meanMS*1000) / 1000
	}
	return out
}

// A stack's stages are read once from each process: a serve process's API shares its /metrics.
func TestStageAddrs(t *testing.T) {
	t.Parallel()
	serve := &stack{metricsAddrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}
	require.Equal(t, []string{"127.0.0.1:1", "127.0.0.1:2"}, stageAddrs(serve, []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}))
	apart := &stack{metricsAddrs: []string{"127.0.0.1:3"}}
	require.Equal(t, []string{"127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:5"}, stageAddrs(apart, []string{"http://127.0.0.1:4", "http://127.0.0.1:5"}))
	require.Equal(t, []string{"127.0.0.1:3"}, apart.metricsAddrs, "the stack's own list is left as it was")
}
