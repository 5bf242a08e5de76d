package batchlane_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestBatcher_SendRefusedWithRetryAfterWaitsIt: Anthropic answers a batch create 429 with
// Retry-After while the organization's batch queue is full. The send is tried again once the
// answer's Retry-After has passed, not at the polls' backoff (30s first) before it: asked
// sooner, the queue is still full, and each early try is one more 429, one more error in the
// pass. A Retry-After past the backoff's cap (10 × poll_interval) waits the cap.
func TestBatcher_SendRefusedWithRetryAfterWaitsIt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, retryAfter string
		// quiet are the clock's steps after the refusal at which no send goes; the send goes a
		// step of 30s after the last.
		quiet []time.Duration
	}{
		{"PastTheBackoff", "120", []time.Duration{31 * time.Second, 60 * time.Second}},
		{"PastTheBackoffsCap", "3600", []time.Duration{31 * time.Second, 4 * time.Minute}}, // 4m31s: 10 × 30s is 5m
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			sendRefusedWithRetryAfterWaitsIt(t, tc.retryAfter, tc.quiet)
		})
	}
}

func sendRefusedWithRetryAfterWaitsIt(t *testing.T, retryAfter string, quiet []time.Duration) {
	var mu sync.Mutex
	creates, full := 0, true
	front := func(sim http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/v1/messages/batches" {
				mu.Lock()
				creates++
				refused := full
				mu.Unlock()
				if refused {
					w.Header().Set("content-type", "application/json")
					w.Header().Set("retry-after", retryAfter)
					w.WriteHeader(http.StatusTooManyRequests)
					_, _ = w.Write([]byte(`{"type":"error","error":{"type":"rate_limit_error","message":"Number of batch requests in queue exceeds the limit"}}`))
					return
				}
			}
			sim.ServeHTTP(w, r)
		})
	}
	tries := func() int {
		mu.Lock()
		defer mu.Unlock()
		return creates
	}
	b := setup(t, setupOpts{front: front})
	bt := b.batcher(nil)
	j := b.submit(t, "x", 0, 0)
	b.clock.Advance(fill)
	require.Error(t, bt.Once(t.Context()))
	require.Equal(t, 1, tries())

	// Past the backoff (30s), within the wait: not sent again.
	for _, step := range quiet {
		b.clock.Advance(step)
		require.NoError(t, bt.Once(t.Context()), "the send was tried again before the answer's Retry-After")
		require.Equal(t, 1, tries(), "the send was tried again before the answer's Retry-After")
	}

	// Past it, the queue has room: the batch goes.
	mu.Lock()
	full = false
	mu.Unlock()
	b.clock.Advance(30 * time.Second)
	once(t, bt)
	require.Equal(t, 2, tries())
	require.Equal(t, 1, b.sim.BatchStats().Created)
	require.Equal(t, jobs.StatusRunning, b.get(t, j.ID).Status)
}
