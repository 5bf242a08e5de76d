package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRetention_WorkerDeletesExpiredJobs: the worker's leader deletes a job once it has been
// finished longer than its status's retention, with its events, attempts and idempotency key,
// on the configured retention.interval (the default, a minute, would outlast the test).
func TestRetention_WorkerDeletesExpiredJobs(t *testing.T) {
	t.Parallel()
	// Given succeeded jobs kept an hour, looked for every 200 ms...
	b := setup(t, setupOpts{top: "retention: { succeeded: 1h, interval: 200ms }"})
	r := b.do(t, http.MethodPost, "/v1/jobs", anthropicBody("expires"), map[string]string{"Idempotency-Key": "retention-e2e"})
	require.Equal(t, http.StatusAccepted, r.status, "body: %v", r.body)
	old := r.body["id"].(string)
	recent := b.submit(t, anthropicBody("kept"))
	for _, id := range []string{old, recent} {
		require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"])
	}

	// ... when one of them finished two hours ago, then it is gone with all it had, within a
	// few passes, and the other is kept.
	var n int
	b.queryRow(t, `WITH u AS (UPDATE jobs SET finished_at = now() - interval '2 hours' WHERE id = $1 RETURNING 1)
SELECT count(*) FROM u`, []any{old}, &n)
	require.Equal(t, 1, n)
	left := func() int {
		b.queryRow(t, `SELECT (SELECT count(*) FROM jobs WHERE id = $1) + (SELECT count(*) FROM job_events WHERE job_id = $1)
	+ (SELECT count(*) FROM job_attempts WHERE job_id = $1) + (SELECT count(*) FROM idempotency_keys WHERE job_id = $1)`, []any{old}, &n)
		return n
	}
	require.Eventually(t, func() bool { return left() == 0 }, 30*time.Second, 50*time.Millisecond,
		"the leader takes its lock within a second, then passes every 200 ms")
	require.Equal(t, http.StatusNotFound, b.do(t, http.MethodGet, "/v1/jobs/"+old, "", nil).status)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/v1/jobs/"+recent, "", nil).status)
}
