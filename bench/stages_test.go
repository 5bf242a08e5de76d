package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"

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
