package e2e_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// TestFairness_InteractiveJobOvertakesAFlood runs behaviour 1 through the whole stack: tenant
// acme floods a credential with 60 low-priority jobs (3 s of its limit); globex's one normal job,
// submitted after all of them, is answered while most of acme's still wait, instead of after all
// 60. The provider sees one request per job and no 429. Counts, not times, are asserted (the
// deterministic timings are internal/limiter's fair tests).
func TestFairness_InteractiveJobOvertakesAFlood(t *testing.T) {
	t.Parallel()
	const n = 60
	b := setup(t, setupOpts{sim: llmsim.Config{Capacity: 15, RefillPerSecond: 20},
		limits: "{requests_per_second: 20, burst: 5}"})
	acme, globex := b.tenantHeader(t, "acme"), b.tenantHeader(t, "globex")

	submit := func(h map[string]string, body string) string {
		r := b.do(t, http.MethodPost, "/v1/jobs", body, h)
		require.Equal(t, http.StatusAccepted, r.status, "body %v", r.body)
		return r.body["id"].(string)
	}
	flood := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flood[i] = submit(acme, `{"priority":"low","request":{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"flood"}]}}`)
		}()
	}
	wg.Wait()
	id := submit(globex, anthropicBody("interactive"))

	// Wait for globex's job as its owner, then count acme's answered jobs.
	var job map[string]any
	require.Eventually(t, func() bool {
		r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", globex)
		job = r.body
		return r.body["status"] == "succeeded"
	}, 60e9, 10e6)
	require.Equal(t, "normal", job["priority"])
	done := 0
	for _, f := range flood {
		r := b.do(t, http.MethodGet, "/v1/jobs/"+f, "", acme)
		require.Equal(t, "low", r.body["priority"])
		if r.body["status"] == "succeeded" {
			done++
		}
	}
	t.Logf("globex's job answered when %d of acme's %d were", done, n)
	require.Less(t, done, n/2, "the interactive job did not wait behind the flood")

	for _, f := range flood {
		require.Eventually(t, func() bool {
			return b.do(t, http.MethodGet, "/v1/jobs/"+f, "", acme).body["status"] == "succeeded"
		}, 60e9, 20e6)
	}
	st := b.sim.Stats()
	require.Equal(t, n+1, st.Requests)
	require.Zero(t, st.ByStatus[429])
}
