package llmsim_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

func TestServer_Bucket(t *testing.T) {
	t.Parallel()

	t.Run("BurstThenRefill", func(t *testing.T) {
		t.Parallel()
		// Given a bucket of 20 refilling at 10/s on a frozen clock
		b := setup(t, llmsim.Config{Capacity: 20, RefillPerSecond: 10})

		// When 20 requests arrive at once, all succeed, each taking one token
		for i := 1; i <= 20; i++ {
			r := b.anthropic(t, "key-a", helloBody)
			require.Equal(t, http.StatusOK, r.status, "request %d: %s", i, r.body)
			if i == 1 {
				require.Equal(t, "20", r.header.Get("anthropic-ratelimit-requests-limit"))
				require.Equal(t, "19", r.header.Get("anthropic-ratelimit-requests-remaining"))
				require.Equal(t, "2026-01-02T03:04:05.100Z", r.header.Get("anthropic-ratelimit-requests-reset"))
			}
		}

		// Then the 21st is refused with retry-after 1 and the bucket unchanged
		r := b.anthropic(t, "key-a", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "rate_limit_error", r.errType(t))
		require.Equal(t, "1", r.header.Get("retry-after"))
		require.Equal(t, "20", r.header.Get("anthropic-ratelimit-requests-limit"))
		require.Equal(t, "0", r.header.Get("anthropic-ratelimit-requests-remaining"))
		require.Equal(t, "2026-01-02T03:04:07.000Z", r.header.Get("anthropic-ratelimit-requests-reset"))

		// When 100 ms pass, exactly one more token is back
		b.clock.Advance(100 * time.Millisecond)
		r = b.anthropic(t, "key-a", helloBody)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "0", r.header.Get("anthropic-ratelimit-requests-remaining"))
		require.Equal(t, "2026-01-02T03:04:07.100Z", r.header.Get("anthropic-ratelimit-requests-reset"))
		require.Empty(t, r.header.Values("retry-after"))
		r = b.anthropic(t, "key-a", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)

		// And another key has its own full bucket, on either endpoint
		r = b.openai(t, "key-b", helloBody)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "20", r.header.Get("x-ratelimit-limit-requests"))
		require.Equal(t, "19", r.header.Get("x-ratelimit-remaining-requests"))
		require.Equal(t, "100ms", r.header.Get("x-ratelimit-reset-requests"))

		// And key-a's empty bucket is shared by its OpenAI requests
		r = b.openai(t, "key-a", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "1", r.header.Get("retry-after"))
		require.Equal(t, "0", r.header.Get("x-ratelimit-remaining-requests"))
		require.Equal(t, "2s", r.header.Get("x-ratelimit-reset-requests"))
		require.Equal(t, "requests", r.errType(t))

		st := b.sim.Stats()
		require.Equal(t, 25, st.Requests)
		require.Equal(t, map[int]int{200: 22, 429: 3}, st.ByStatus)
		require.Equal(t, 21, st.ByKey[llmsim.KeyID("key-a")].ByStatus[200])
		require.Equal(t, 3, st.ByKey[llmsim.KeyID("key-a")].ByStatus[429])
	})

	t.Run("RetryAfterRoundsUp", func(t *testing.T) {
		t.Parallel()
		// Given one token refilling every 2.5 s
		b := setup(t, llmsim.Config{Capacity: 1, RefillPerSecond: 0.4})
		r := b.openai(t, "k", helloBody)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "2.5s", r.header.Get("x-ratelimit-reset-requests"))

		r = b.openai(t, "k", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "3", r.header.Get("retry-after"))

		b.clock.Advance(2*time.Second + 499*time.Millisecond)
		r = b.openai(t, "k", helloBody)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "1", r.header.Get("retry-after"))
		require.Equal(t, "1ms", r.header.Get("x-ratelimit-reset-requests"))

		b.clock.Advance(time.Millisecond)
		r = b.openai(t, "k", helloBody)
		require.Equal(t, http.StatusOK, r.status)
	})

	t.Run("RateLearnableFromHeaders", func(t *testing.T) {
		t.Parallel()
		// Given a bucket of 60 refilling at 3/s
		b := setup(t, llmsim.Config{Capacity: 60, RefillPerSecond: 3})
		var r result
		for range 10 {
			r = b.anthropic(t, "k", helloBody)
			require.Equal(t, http.StatusOK, r.status)
		}
		// Then (limit-remaining)/(reset-now) is the refill rate
		reset, err := time.Parse(time.RFC3339Nano, r.header.Get("anthropic-ratelimit-requests-reset"))
		require.NoError(t, err)
		require.Equal(t, "50", r.header.Get("anthropic-ratelimit-requests-remaining"))
		require.InDelta(t, 3.0, 10/reset.Sub(t0).Seconds(), 0.001)
	})

	t.Run("UnlimitedSendsNoHeaders", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		for range 50 {
			r := b.anthropic(t, "k", helloBody)
			require.Equal(t, http.StatusOK, r.status)
			require.Empty(t, r.header.Values("anthropic-ratelimit-requests-limit"))
			require.NotEmpty(t, r.header.Get("request-id"))
		}
		r := b.openai(t, "k", helloBody)
		require.Empty(t, r.header.Values("x-ratelimit-limit-requests"))
		require.NotEmpty(t, r.header.Get("x-request-id"))
	})

	t.Run("ConcurrentTakesAreExact", func(t *testing.T) {
		t.Parallel()
		// Given 50 tokens and almost no refill
		b := setup(t, llmsim.Config{Capacity: 50, RefillPerSecond: 0.001})
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			counts = map[int]int{}
		)
		// When 200 requests race
		for range 200 {
			wg.Go(func() {
				r, err := b.do(t, t.Context(), http.MethodPost, "/v1/messages",
					map[string]string{"x-api-key": "k", "anthropic-version": "2023-06-01"}, helloBody)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				counts[r.status]++
				mu.Unlock()
			})
		}
		wg.Wait()
		// Then exactly 50 succeed
		require.Equal(t, map[int]int{200: 50, 429: 150}, counts)
		require.Equal(t, counts, b.sim.Stats().ByStatus)
	})
}

func TestConfig_Validate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  llmsim.Config
		want string
	}{
		"Zero":              {cfg: llmsim.Config{}},
		"NegativeCapacity":  {cfg: llmsim.Config{Capacity: -1, RefillPerSecond: 1}, want: "capacity"},
		"FractionalBucket":  {cfg: llmsim.Config{Capacity: 0.5, RefillPerSecond: 1}, want: "capacity"},
		"CapacityNoRefill":  {cfg: llmsim.Config{Capacity: 5}, want: "refill_per_second"},
		"NegativeLatency":   {cfg: llmsim.Config{Latency: -time.Second}, want: "latency"},
		"NegativeJitter":    {cfg: llmsim.Config{LatencyJitter: -time.Second}, want: "latency_jitter"},
		"BadErrorRate":      {cfg: llmsim.Config{Faults: llmsim.Faults{ErrorRate: 1.5}}, want: "faults: error_rate"},
		"BadErrorStatus":    {cfg: llmsim.Config{Faults: llmsim.Faults{ErrorStatus: 200}}, want: "faults: error_status"},
		"BadFailNextStatus": {cfg: llmsim.Config{Faults: llmsim.Faults{FailNextStatus: 302}}, want: "faults: fail_next_status"},
		"NegativeFailNext":  {cfg: llmsim.Config{Faults: llmsim.Faults{FailNext: -1}}, want: "faults: fail_next"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.Validate()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.want)
			require.Panics(t, func() { llmsim.New(tc.cfg) })
		})
	}
}
