package e2e_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// TestSubmit_WakesTheIdleWorker: with a poll interval of 2s, each job submitted to an idle worker
// is picked up through a wake-up left by the API's enqueue (llmq_worker_idle_waits_total
// {ended="wake-up"} counts one per job), not by the worker's poll: the API and the worker are
// wired to the same wake set.
func TestSubmit_WakesTheIdleWorker(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{worker: "poll_interval: 2s"})
	const jobs = 3
	for range jobs {
		job := b.waitTerminal(t, b.submit(t, anthropicBody("wake up")))
		require.Equal(t, "succeeded", job["status"])
	}
	require.GreaterOrEqual(t, idleWaitsEndedBy(t, b.workerMetrics, "wake-up"), float64(jobs))
}

// idleWaitsEndedBy reads llmq_worker_idle_waits_total{ended} from reg.
func idleWaitsEndedBy(t *testing.T, reg prometheus.Gatherer, ended string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "llmq_worker_idle_waits_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "ended" && l.GetValue() == ended {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("llmq_worker_idle_waits_total{ended=%q} not exported", ended)
	return 0
}
