package e2e_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// TestFairness_LongCallsLeaveOtherTenantsSlots: tenant acme's calls of a minute fill a worker of
// 4 delivery slots first come first served, its 8 jobs ahead of globex's one in asynq's pending
// list. acme holds at most its share of the slots (alone: all but the reserve of one), its other
// deliveries are deferred, and globex's job, on a fast credential, finishes while acme's first
// calls are still held, instead of after them. States are asserted, not times.
func TestFairness_LongCallsLeaveOtherTenantsSlots(t *testing.T) {
	t.Parallel()
	const flood = 8
	b := setup(t, setupOpts{sim: llmsim.Config{Latency: time.Minute}, concurrency: 4, noWorker: true,
		limits:         "{requests_per_second: 100, burst: 100}",
		workerShutdown: 100 * time.Millisecond})
	acme, globex := b.tenantHeader(t, "acme"), b.tenantHeader(t, "globex")
	ids := make([]string, flood)
	for i := range ids {
		ids[i] = b.submitAs(t, acme, anthropicBody("a long one"))
	}
	id := b.submitAs(t, globex, `{"credential":"backup",`+anthropicBody("short")[1:])
	b.startWorker(t)

	deadline := time.Now().Add(30 * time.Second) // half of acme's calls
	for {
		r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", globex)
		if r.body["status"] == "succeeded" {
			break
		}
		require.True(t, time.Now().Before(deadline), "globex's job still %v behind acme's calls", r.body["status"])
		time.Sleep(20 * time.Millisecond) // polling with a deadline, as a client would
	}
	// acme's first three deliveries, ahead of globex's, may still be starting their attempts.
	var started, running int
	require.Eventually(t, func() bool {
		b.queryRow(t, `SELECT count(*) FILTER (WHERE attempts > 0), count(*) FILTER (WHERE status = 'running')
FROM jobs WHERE tenant = 'acme'`, nil, &started, &running)
		return started >= 3
	}, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 3, started, "acme holds every slot but the reserve, not more")
	require.Equal(t, 3, running, "acme's first calls are still held")

	// Its other jobs wait, deferred by the rule, as asynq shows their tasks.
	insp := b.inspector(t)
	require.Eventually(t, func() bool {
		for _, f := range ids {
			if _, why, ok := b.deferral(insp, f); ok && strings.Contains(why, "share of this worker's delivery slots") {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond)
}
