package e2e_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// TestFairness_InteractiveJobOvertakesAFlood runs behaviour 1 through the whole stack: tenant
// acme floods a credential with 60 low-priority jobs (6 s of its limit); globex's one normal job,
// submitted after all of them, goes to the provider before most of acme's that still wait,
// instead of after all of them. The provider sees one request per job and no 429. The order of
// the attempts is asserted, not their times (the deterministic timings are internal/limiter's
// fair tests).
func TestFairness_InteractiveJobOvertakesAFlood(t *testing.T) {
	t.Parallel()
	const n = 60
	b := setup(t, setupOpts{sim: llmsim.Config{Capacity: 15, RefillPerSecond: 10},
		limits: "{requests_per_second: 10, burst: 5}"})
	acme, globex := b.tenantHeader(t, "acme"), b.tenantHeader(t, "globex")

	flood := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			flood[i] = b.submitAs(t, acme, `{"priority":"low","request":{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"flood"}]}}`)
		}()
	}
	wg.Wait()
	id := b.submitAs(t, globex, anthropicBody("interactive"))

	var job map[string]any
	require.Eventually(t, func() bool {
		r := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", globex)
		job = r.body
		return r.body["status"] == "succeeded"
	}, 60e9, 10e6)
	require.Equal(t, "normal", job["priority"])
	for _, f := range flood {
		require.Eventually(t, func() bool {
			r := b.do(t, http.MethodGet, "/v1/jobs/"+f, "", acme)
			require.Equal(t, "low", r.body["priority"])
			return r.body["status"] == "succeeded"
		}, 60e9, 20e6)
	}
	// Of acme's jobs not yet sent when globex's was submitted, how many the provider got before
	// globex's: from the attempts' start times, so that how fast the flood was submitted does
	// not matter (under load, acme's first jobs are answered while the rest are submitted).
	var waiting, ahead int
	b.queryRow(t, `SELECT count(*) FILTER (WHERE a.started_at > g.created_at),
	count(*) FILTER (WHERE a.started_at > g.created_at AND a.started_at < ga.started_at)
FROM job_attempts a JOIN jobs j ON j.id = a.job_id, jobs g JOIN job_attempts ga ON ga.job_id = g.id
WHERE j.tenant = 'acme' AND g.id = $1`, []any{id}, &waiting, &ahead)
	t.Logf("when globex's job was submitted %d of acme's %d were still unsent; %d of them went first", waiting, n, ahead)
	require.GreaterOrEqual(t, waiting, 10, "the flood was still waiting (at 10 requests/s it takes 5.5 s)")
	require.Less(t, ahead, waiting/2, "the interactive job did not wait behind the flood")
	st := b.sim.Stats()
	require.Equal(t, n+1, st.Requests)
	require.Zero(t, st.ByStatus[429])
}
