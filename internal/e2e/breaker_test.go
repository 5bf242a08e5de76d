package e2e_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

func TestBreaker_OneProbeAcrossWorkersThenRecovery(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, r redistest.Target) {
		b := setup(t, setupOpts{
			redisURL: r.URL,
			sim:      llmsim.Config{Faults: llmsim.Faults{FailNext: 1000, FailNextStatus: 529}},
			extra:    "attempt_timeout: 6s",
			top:      "breaker: { threshold: 2, cooldown: 1s }",
		})
		b.startWorker(t) // a second worker process
		brk := b.breakerCredential(t, "default")
		insp := b.inspector(t)

		// Given a provider answering 529, two failures open the breaker.
		ids := []string{b.submit(t, anthropicBody("down 1")), b.submit(t, anthropicBody("down 2"))}
		require.Eventually(t, func() bool {
			st, err := brk.Status(b.ctx)
			return err == nil && st.State == breaker.Open
		}, 20*time.Second, 10*time.Millisecond)
		require.Eventually(t, func() bool { return b.sim.Stats().InFlight == 0 }, 30*time.Second, 10*time.Millisecond)
		for range 48 {
			ids = append(ids, b.submit(t, anthropicBody("waiting for the provider")))
		}

		// When the cooldown ends while the provider hangs, exactly one probe reaches it: every
		// other job is refused while the probe is out, across both workers.
		require.NoError(t, b.sim.SetFaults(llmsim.Faults{Hang: true}))
		// Answered requests, leaving out hung probes the worker gave up on (499): under load the
		// checks below can outlast a probe's attempt timeout, and the next probe then hangs too.
		answered := func() int { st := b.sim.Stats(); return st.Requests - st.ByStatus[llmsim.StatusClientClosed] }
		before := answered()
		require.Eventually(t, func() bool { return b.sim.Stats().InFlight == 1 }, 20*time.Second, 10*time.Millisecond)
		// Each job is refused while the probe is out, or is active: the probe itself, or (under
		// load) a job held inline on the breaker (executor.MaxInlineWait), whose last error may
		// still be an earlier refusal. That nothing but the probe reached the provider is what the
		// simulator's counts below check.
		for _, id := range ids {
			require.Eventually(t, func() bool {
				active, why, ok := b.deferral(insp, id)
				return ok && (active || strings.Contains(why, "circuit half_open"))
			}, 20*time.Second, 10*time.Millisecond, "job %s was never refused during the probe", id)
		}
		st := b.sim.Stats()
		require.LessOrEqual(t, st.InFlight, 1, "one probe at a time, no other request")
		require.Equal(t, before, answered(), "only hung probes reached the provider")

		// When the provider recovers, the hung probe times out (a failure: the breaker re-opens), the
		// next probe succeeds and closes it, and every job succeeds.
		require.NoError(t, b.sim.SetFaults(llmsim.Faults{}))
		for _, id := range ids {
			require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"])
		}
		status, err := brk.Status(b.ctx)
		require.NoError(t, err)
		require.Equal(t, breaker.Closed, status.State)
		require.Equal(t, 50, b.sim.Stats().ByStatus[200])
	})
}

// breakerCredential returns the shared breaker of a configured credential, as the workers see it.
func (b *testBundle) breakerCredential(t *testing.T, name string) *breaker.Circuit {
	t.Helper()
	brk, err := breaker.New(redistest.ClientOf(t, b.redisURL), &breaker.Config{Prefix: b.prefix})
	require.NoError(t, err)
	c, ok := b.cfg.Credential(name)
	require.True(t, ok)
	return brk.Circuit(c.LimiterID(), name)
}
