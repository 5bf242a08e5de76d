package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
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
