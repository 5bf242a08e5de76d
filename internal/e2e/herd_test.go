package e2e_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/redistest"
)

// A burst against a provider bucket: the shared limiter spreads it so that no request is
// refused. Counts, not times, are asserted (the timed figures live in the bench module: make bench BENCHES=herd).
func TestHerd_SharedLimiterAvoids429s(t *testing.T) {
	t.Parallel()
	const n = 30
	// The provider's bucket holds 10 more than the configured burst. A burst the worker sends
	// late (a loaded CI machine under -race delays it by 100-300 ms, and the whole suite under
	// -count=2 with two busy loops by more: 5 spare tokens once let 3 of 30 be refused) leaves
	// the provider's bucket full meanwhile, so the refill our schedule counted on is lost and the
	// on-time requests after it can find the bucket empty; the limiter's default 100 ms phase
	// margin covers only part of that. Ten spare tokens cover 500 ms more, and a phase margin of
	// 1 s more again (the token-pacing test saw a first burst land over 500 ms late). Without the
	// limiter, 15 of the 30 would still be refused; the spacing's arithmetic is the limiter's
	// own tests' (on an injected clock), the exact figures on a quiet machine the herd bench's.
	sim := llmsim.Config{Capacity: 15, RefillPerSecond: 20}

	run := func(t *testing.T, redisURL, limits string) (requests, refused int) {
		b := setup(t, setupOpts{sim: sim, redisURL: redisURL, limits: limits, worker: "phase_margin: 1s"})
		ids := make([]string, n)
		answers := make([]response, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i], errs[i] = b.tryDo(http.MethodPost, "/v1/jobs",
					`{"max_attempts":10,"request":{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"herd"}]}}`, nil)
			}()
		}
		wg.Wait()
		for i, r := range answers {
			require.NoError(t, errs[i])
			require.Equal(t, http.StatusAccepted, r.status, "body: %v", r.body)
			ids[i] = r.body["id"].(string)
		}
		for _, id := range ids {
			require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"])
		}
		st := b.sim.Stats()
		return st.Requests, st.ByStatus[429]
	}

	redistest.OnEach(t, func(t *testing.T, r redistest.Target) {
		t.Run("Configured", func(t *testing.T) {
			t.Parallel()
			requests, refused := run(t, r.URL, "{requests_per_second: 20, burst: 5}")
			require.Zero(t, refused)
			require.Equal(t, n, requests)
		})
		t.Run("Learned", func(t *testing.T) {
			t.Parallel()
			requests, refused := run(t, r.URL, "")
			require.LessOrEqual(t, requests, n+n/10, "refused %d", refused)
		})
	})
}
