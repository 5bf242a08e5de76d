package batchlane_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBatcher_PollRefusedWithRetryAfterWaitsIt: a provider that answers a sent batch's poll,
// its results download or its cancel with a Retry-After (a 429 while its batch API is
// overloaded, a 503 in maintenance) is asked again once the answer's Retry-After has passed, as
// a refused send is (TestBatcher_SendRefusedWithRetryAfterWaitsIt), not at the polls' backoff
// (60s after the first failure) before it, into one more refusal. A Retry-After past the
// backoff's cap (10 × poll_interval, 5m) waits the cap; an HTTP-date is read on the answer's
// Date. A poll refused before a cancel (a batch no job waits for) waits it too, rather than
// send the cancel at once into the same refusal.
func TestBatcher_PollRefusedWithRetryAfterWaitsIt(t *testing.T) {
	t.Parallel()
	anthropicPoll := func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/messages/batches/") &&
			strings.Count(r.URL.Path, "/") == 4
	}
	anthropicResults := func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/results") }
	cancel := func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/cancel") }
	openAIDownload := func(r *http.Request) bool {
		return strings.HasPrefix(r.URL.Path, "/v1/files/") && strings.HasSuffix(r.URL.Path, "/content")
	}
	for _, tc := range []struct {
		name, provider string
		status         int
		retryAfter     string // "date+120": an HTTP-date 120s on, on the answer's Date
		refuse         func(r *http.Request) bool
		ended          bool // the batch ends before its first poll (its results are read)
		cancel         bool // its job is canceled: the batch is polled, then canceled
		quiet          []time.Duration
	}{
		{name: "Poll429", provider: "anthropic", status: http.StatusTooManyRequests, retryAfter: "120", refuse: anthropicPoll,
			quiet: []time.Duration{61 * time.Second}},
		{name: "Poll503", provider: "anthropic", status: http.StatusServiceUnavailable, retryAfter: "120", refuse: anthropicPoll,
			quiet: []time.Duration{61 * time.Second}},
		{name: "PollHTTPDate", provider: "anthropic", status: http.StatusTooManyRequests, retryAfter: "date+120", refuse: anthropicPoll,
			quiet: []time.Duration{61 * time.Second}},
		{name: "PollPastTheCap", provider: "anthropic", status: http.StatusTooManyRequests, retryAfter: "3600", refuse: anthropicPoll,
			quiet: []time.Duration{61 * time.Second, 3 * time.Minute}}, // 4m01s; the cap is 5m
		{name: "Results", provider: "anthropic", status: http.StatusTooManyRequests, retryAfter: "120", refuse: anthropicResults,
			ended: true, quiet: []time.Duration{61 * time.Second}},
		{name: "OpenAIResultsDownload", provider: "openai", status: http.StatusTooManyRequests, retryAfter: "120", refuse: openAIDownload,
			ended: true, quiet: []time.Duration{61 * time.Second}},
		{name: "Cancel", provider: "anthropic", status: http.StatusTooManyRequests, retryAfter: "120", refuse: cancel,
			cancel: true, quiet: []time.Duration{61 * time.Second}},
		{name: "PollBeforeCancel", provider: "anthropic", status: http.StatusTooManyRequests, retryAfter: "120",
			refuse: func(r *http.Request) bool { return anthropicPoll(r) || cancel(r) },
			cancel: true, quiet: []time.Duration{61 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				mu       sync.Mutex
				calls    int
				refusing = true
				now      func() time.Time
			)
			front := func(sim http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if !tc.refuse(r) {
						sim.ServeHTTP(w, r)
						return
					}
					mu.Lock()
					calls++
					refused := refusing
					mu.Unlock()
					if !refused {
						sim.ServeHTTP(w, r)
						return
					}
					ra := tc.retryAfter
					if ra == "date+120" {
						// The provider's clock is an hour behind ours: the date is read on its Date.
						at := now().Add(-time.Hour)
						w.Header().Set("date", at.UTC().Format(http.TimeFormat))
						ra = at.Add(120 * time.Second).UTC().Format(http.TimeFormat)
					}
					w.Header().Set("content-type", "application/json")
					w.Header().Set("retry-after", ra)
					w.WriteHeader(tc.status)
					_, _ = w.Write([]byte(`{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`))
				})
			}
			tries := func() int {
				mu.Lock()
				defer mu.Unlock()
				return calls
			}
			delay := time.Hour
			if tc.ended {
				delay = 10 * time.Second
			}
			b := setup(t, setupOpts{provider: tc.provider, delay: delay, front: front})
			now = b.clock.Now
			bt := b.batcher(nil)
			j := b.submit(t, "x", 0, 0)
			b.clock.Advance(fill)
			once(t, bt)
			if tc.cancel {
				_, err := b.store.Cancel(t.Context(), j.ID)
				require.NoError(t, err)
			}

			b.clock.Advance(30 * time.Second)
			require.Error(t, bt.Once(t.Context()))
			require.Equal(t, 1, tries(), "one refused call a pass")

			// Past the backoff (60s), within the Retry-After: not asked again.
			for _, step := range tc.quiet {
				b.clock.Advance(step)
				require.NoError(t, bt.Once(t.Context()), "the provider was asked again before the answer's Retry-After")
				require.Equal(t, 1, tries(), "the provider was asked again before the answer's Retry-After")
			}

			// Past it, the provider answers: the batch goes on.
			mu.Lock()
			refusing = false
			mu.Unlock()
			b.clock.Advance(time.Minute)
			once(t, bt)
			require.GreaterOrEqual(t, tries(), 2)
			if tc.ended {
				require.Equal(t, "succeeded", string(b.get(t, j.ID).Status))
			}
			if tc.cancel {
				require.Equal(t, 1, b.sim.BatchStats().Cancels)
			}
		})
	}
}
