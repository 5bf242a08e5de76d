package worker_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/worker"
)

// TestWorker_MeasuresTheBacklogWhileLeadingMaintenance: the worker that leads maintenance
// exports the online lane's jobs waiting and the oldest one's age (LLMQJobsWaitingTooLong reads
// it), measured in Postgres; the date of the last measurement is there at 0 from the start, so a
// fleet where no worker ever measures shows as such.
func TestWorker_MeasuresTheBacklogWhileLeadingMaintenance(t *testing.T) {
	t.Parallel()
	b := setup(t, worker.Options{})
	requireSeries(t, b.reg, "llmq_jobs_waiting_last_success_timestamp_seconds", "", 1)
	require.Empty(t, values(t, b.reg, "llmq_jobs_waiting"), "measured only once leading")

	b.run(t)
	require.Eventually(t, func() bool {
		v := values(t, b.reg, "llmq_jobs_waiting")
		return len(v) == 2 && len(values(t, b.reg, "llmq_jobs_oldest_waiting_age_seconds")) == 1
	}, 30*time.Second, 10*time.Millisecond)
	requireSeries(t, b.reg, "llmq_jobs_waiting", `status="queued"`, 1)
	requireSeries(t, b.reg, "llmq_jobs_waiting", `status="retrying"`, 1)
	require.Positive(t, values(t, b.reg, "llmq_jobs_waiting_last_success_timestamp_seconds")[""])
}
