package llmsim_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// promptBody is a request whose only message is textBytes of "a" (so
// textBytes/4 input tokens) with the given max_tokens (none when 0).
func promptBody(textBytes, maxTokens int) string {
	mt := ""
	if maxTokens > 0 {
		mt = fmt.Sprintf(`"max_tokens":%d,`, maxTokens)
	}
	return fmt.Sprintf(`{"model":"sim-model",%s"messages":[{"role":"user","content":%q}]}`, mt, strings.Repeat("a", textBytes))
}

// requireHeaders checks each header's exact value; "" means absent.
func requireHeaders(t *testing.T, r result, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if v == "" {
			require.Empty(t, r.header.Values(k), "header %s", k)
			continue
		}
		require.Equal(t, v, r.header.Get(k), "header %s", k)
	}
}

// outputTokens returns usage.output_tokens (Anthropic) or completion_tokens (OpenAI).
func outputTokens(t *testing.T, r result) int {
	t.Helper()
	u, ok := r.json(t)["usage"].(map[string]any)
	require.True(t, ok, "no usage in %s", r.body)
	if v, ok := u["output_tokens"].(float64); ok {
		return int(v)
	}
	v, ok := u["completion_tokens"].(float64)
	require.True(t, ok, "no output tokens in %s", r.body)
	return int(v)
}

func errMessage(t *testing.T, r result) string {
	t.Helper()
	e, ok := r.json(t)["error"].(map[string]any)
	require.True(t, ok, "no error object in %s", r.body)
	s, _ := e["message"].(string)
	return s
}

func TestServer_TokenLimits(t *testing.T) {
	t.Parallel()

	t.Run("AnthropicInputExhaustion", func(t *testing.T) {
		t.Parallel()
		// Given 1,000 input tokens (one per 60 ms) and 200 output tokens (one
		// per 300 ms) per minute, and prompts of 500 input tokens, max_tokens 40
		b := setup(t, llmsim.Config{InputTokensPerMinute: 1000, OutputTokensPerMinute: 200})
		body := promptBody(2000, 40)

		// When two requests arrive at once, both succeed; the output bucket
		// is charged the reply's 19 tokens, not the 40 reserved
		r := b.anthropic(t, "key-a", body)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, 19, outputTokens(t, r))
		requireHeaders(t, r, map[string]string{
			"anthropic-ratelimit-input-tokens-limit":      "1000",
			"anthropic-ratelimit-input-tokens-remaining":  "500",
			"anthropic-ratelimit-input-tokens-reset":      "2026-01-02T03:04:35.000Z",
			"anthropic-ratelimit-output-tokens-limit":     "200",
			"anthropic-ratelimit-output-tokens-remaining": "181",
			"anthropic-ratelimit-output-tokens-reset":     "2026-01-02T03:04:10.700Z",
			"anthropic-ratelimit-tokens-limit":            "1200",
			"anthropic-ratelimit-tokens-remaining":        "681",
			"anthropic-ratelimit-tokens-reset":            "2026-01-02T03:04:35.000Z",
			"anthropic-ratelimit-requests-limit":          "",
			"retry-after":                                 "",
		})
		r = b.anthropic(t, "key-a", body)
		require.Equal(t, http.StatusOK, r.status)
		requireHeaders(t, r, map[string]string{
			"anthropic-ratelimit-input-tokens-remaining":  "0",
			"anthropic-ratelimit-input-tokens-reset":      "2026-01-02T03:05:05.000Z",
			"anthropic-ratelimit-output-tokens-remaining": "162",
			"anthropic-ratelimit-output-tokens-reset":     "2026-01-02T03:04:16.400Z",
			"anthropic-ratelimit-tokens-remaining":        "162",
			"anthropic-ratelimit-tokens-reset":            "2026-01-02T03:05:05.000Z",
		})

		// Then the third is refused until 500 input tokens are back: 30 s
		r = b.anthropic(t, "key-a", body)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "rate_limit_error", r.errType(t))
		require.Contains(t, errMessage(t, r), "1000 input tokens per minute")
		requireHeaders(t, r, map[string]string{
			"retry-after": "30",
			"anthropic-ratelimit-input-tokens-remaining":  "0",
			"anthropic-ratelimit-output-tokens-remaining": "162",
		})

		// And one nanosecond early it is still refused, retry-after rounded up
		b.clock.Advance(30*time.Second - time.Nanosecond)
		r = b.anthropic(t, "key-a", body)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		requireHeaders(t, r, map[string]string{
			"retry-after": "1",
			"anthropic-ratelimit-input-tokens-remaining": "499",
			"anthropic-ratelimit-input-tokens-reset":     "2026-01-02T03:05:05.000Z",
		})
		// And on the nanosecond it is admitted
		b.clock.Advance(time.Nanosecond)
		r = b.anthropic(t, "key-a", body)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "0", r.header.Get("anthropic-ratelimit-input-tokens-remaining"))

		st := b.sim.Stats()
		require.Equal(t, map[int]int{200: 3, 429: 2}, st.ByStatus)
		require.Equal(t, 1500, st.InputTokens)
		require.Equal(t, 57, st.OutputTokens)
		require.Equal(t, llmsim.KeyStats{Requests: 5, ByStatus: map[int]int{200: 3, 429: 2}, InputTokens: 1500, OutputTokens: 57},
			st.ByKey[llmsim.KeyID("key-a")])

		// And another key has its own full buckets
		r = b.anthropic(t, "key-b", body)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "500", r.header.Get("anthropic-ratelimit-input-tokens-remaining"))
		require.Equal(t, "181", r.header.Get("anthropic-ratelimit-output-tokens-remaining"))
	})

	t.Run("TokenRefusalChargesNoRequestToken", func(t *testing.T) {
		t.Parallel()
		// Given a request bucket of 5 and 1,000 input tokens per minute only
		b := setup(t, llmsim.Config{Capacity: 5, RefillPerSecond: 1, InputTokensPerMinute: 1000})
		body := promptBody(2000, 40)
		for range 2 {
			require.Equal(t, http.StatusOK, b.anthropic(t, "k", body).status)
		}
		// When the input bucket refuses
		r := b.anthropic(t, "k", body)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		// Then the request bucket kept its token, and only input headers are sent
		requireHeaders(t, r, map[string]string{
			"retry-after":                                 "30",
			"anthropic-ratelimit-requests-remaining":      "3",
			"anthropic-ratelimit-requests-reset":          "2026-01-02T03:04:07.000Z",
			"anthropic-ratelimit-input-tokens-limit":      "1000",
			"anthropic-ratelimit-tokens-limit":            "1000",
			"anthropic-ratelimit-tokens-remaining":        "0",
			"anthropic-ratelimit-output-tokens-limit":     "",
			"anthropic-ratelimit-output-tokens-remaining": "",
		})

		// And when the request bucket is empty too, retry-after is the longer wait
		b2 := setup(t, llmsim.Config{Capacity: 1, RefillPerSecond: 0.01, InputTokensPerMinute: 1000})
		require.Equal(t, http.StatusOK, b2.anthropic(t, "k", promptBody(4000, 1)).status)
		r = b2.anthropic(t, "k", promptBody(4, 1))
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "100", r.header.Get("retry-after"))
		require.Contains(t, errMessage(t, r), "exceed your account's rate limit")
	})

	t.Run("AnthropicOutputReservedAndTruedUp", func(t *testing.T) {
		t.Parallel()
		// Given 100 output tokens per minute (one per 600 ms) and replies of
		// exactly 30 tokens
		b := setup(t, llmsim.Config{OutputTokensPerMinute: 100, ReplyTokens: 30})
		hello := func(maxTokens int) string {
			return fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"Hello, simulator!"}]}`, maxTokens)
		}

		// When a request reserves 50, it is charged the 30 it used
		r := b.anthropic(t, "k", hello(50))
		require.Equal(t, http.StatusOK, r.status)
		content := r.json(t)["content"].([]any)[0].(map[string]any)["text"].(string)
		require.Len(t, content, 120)
		require.True(t, strings.HasPrefix(content, "llmsim reply to: Hello, simulator! lorem ipsum"), content)
		require.Equal(t, 30, outputTokens(t, r))
		require.Equal(t, "end_turn", r.json(t)["stop_reason"])
		requireHeaders(t, r, map[string]string{
			"anthropic-ratelimit-output-tokens-limit":     "100",
			"anthropic-ratelimit-output-tokens-remaining": "70",
			"anthropic-ratelimit-output-tokens-reset":     "2026-01-02T03:04:23.000Z",
			"anthropic-ratelimit-tokens-limit":            "100",
			"anthropic-ratelimit-tokens-remaining":        "70",
			"anthropic-ratelimit-input-tokens-limit":      "",
		})
		r = b.anthropic(t, "k", hello(50))
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "40", r.header.Get("anthropic-ratelimit-output-tokens-remaining"))

		// Then max_tokens 50 no longer fits: 10 more tokens take 6 s
		r = b.anthropic(t, "k", hello(50))
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "6", r.header.Get("retry-after"))
		require.Contains(t, errMessage(t, r), "100 output tokens per minute")
		// But max_tokens 40 does
		r = b.anthropic(t, "k", hello(40))
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "10", r.header.Get("anthropic-ratelimit-output-tokens-remaining"))

		// And max_tokens above the whole bucket can never fit: 400, nothing charged
		r = b.anthropic(t, "k", hello(101))
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Equal(t, "invalid_request_error", r.errType(t))
		msg := errMessage(t, r)
		require.Contains(t, msg, "max_tokens: 101")
		require.Contains(t, msg, "output-token rate limit of 100")
		require.Contains(t, msg, "never")
		require.Equal(t, "10", r.header.Get("anthropic-ratelimit-output-tokens-remaining"))
		require.Empty(t, r.header.Values("retry-after"))

		// And a reply stops at a max_tokens below ReplyTokens
		b.clock.Advance(time.Minute)
		r = b.anthropic(t, "k", hello(20))
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, 20, outputTokens(t, r))
		require.Equal(t, "max_tokens", r.json(t)["stop_reason"])
		require.Equal(t, "80", r.header.Get("anthropic-ratelimit-output-tokens-remaining"))

		st := b.sim.Stats()
		require.Equal(t, 16, st.InputTokens) // 4 admitted requests of 4 input tokens
		require.Equal(t, 110, st.OutputTokens)
	})

	t.Run("InputTooLargeForBucket", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{InputTokensPerMinute: 1000})
		r := b.anthropic(t, "k", promptBody(4004, 10))
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Equal(t, "invalid_request_error", r.errType(t))
		require.Contains(t, errMessage(t, r), "prompt is 1001 input tokens, more than the whole input-token rate limit of 1000")
		require.Equal(t, "1000", r.header.Get("anthropic-ratelimit-input-tokens-remaining"))
		// Exactly the whole bucket fits
		r = b.anthropic(t, "k", promptBody(4000, 10))
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "0", r.header.Get("anthropic-ratelimit-input-tokens-remaining"))
		require.Equal(t, 1000, b.sim.Stats().InputTokens)
	})

	t.Run("OpenAICombinedBucket", func(t *testing.T) {
		t.Parallel()
		// Given 1,000 input + 200 output tokens: one OpenAI bucket of 1,200
		// (one token per 50 ms)
		b := setup(t, llmsim.Config{InputTokensPerMinute: 1000, OutputTokensPerMinute: 200})
		body := promptBody(2000, 100)

		// When a request of 500 input tokens and max_tokens 100 succeeds, the
		// bucket is charged 500 + the 19 it used
		r := b.openai(t, "key-a", body)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, 19, outputTokens(t, r))
		requireHeaders(t, r, map[string]string{
			"x-ratelimit-limit-tokens":               "1200",
			"x-ratelimit-remaining-tokens":           "681",
			"x-ratelimit-reset-tokens":               "25.95s",
			"x-ratelimit-limit-requests":             "",
			"anthropic-ratelimit-tokens-limit":       "",
			"anthropic-ratelimit-input-tokens-limit": "",
		})
		r = b.openai(t, "key-a", body)
		require.Equal(t, http.StatusOK, r.status)
		requireHeaders(t, r, map[string]string{
			"x-ratelimit-remaining-tokens": "162",
			"x-ratelimit-reset-tokens":     "51.9s",
		})

		// Then 600 more do not fit: 438 tokens take 21.9 s
		r = b.openai(t, "key-a", body)
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "tokens", r.errType(t))
		require.Equal(t, "rate_limit_exceeded", r.json(t)["error"].(map[string]any)["code"])
		require.Equal(t, "Rate limit reached for sim-model on tokens per min (TPM): Limit 1200, Used 1038, Requested 600. "+
			"Please try again in 21.9s.", errMessage(t, r))
		requireHeaders(t, r, map[string]string{
			"retry-after":                  "22",
			"x-ratelimit-remaining-tokens": "162",
			"x-ratelimit-reset-tokens":     "51.9s",
		})

		// And max_completion_tokens is the reserve when given
		b.clock.Advance(21900 * time.Millisecond)
		r = b.openai(t, "key-a", `{"model":"m","max_tokens":5000,"max_completion_tokens":100,"messages":[{"role":"user","content":"`+strings.Repeat("a", 2000)+`"}]}`)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, "81", r.header.Get("x-ratelimit-remaining-tokens"))

		// And input + max_tokens above the whole bucket can never fit: OpenAI's 429 "Request too
		// large", without retry-after (no wait heals it)
		r = b.openai(t, "key-b", promptBody(4000, 201))
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "tokens", r.errType(t))
		require.Equal(t, "rate_limit_exceeded", r.json(t)["error"].(map[string]any)["code"])
		require.Equal(t, "Request too large for sim-model in organization org-llmsim on tokens per min (TPM): "+
			"Limit 1200, Requested 1201. The input or output tokens must be reduced in order to run successfully. "+
			"Visit https://platform.openai.com/account/rate-limits to learn more.", errMessage(t, r))
		require.Empty(t, r.header.Get("retry-after"))
		require.Equal(t, "1200", r.header.Get("x-ratelimit-remaining-tokens"))

		// And the same key's Anthropic buckets are separate
		r = b.anthropic(t, "key-a", body)
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "500", r.header.Get("anthropic-ratelimit-input-tokens-remaining"))
	})

	t.Run("OpenAIOneLimitIsTheBucket", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{OutputTokensPerMinute: 300})
		r := b.openai(t, "k", promptBody(400, 0)) // 100 input, reserve 1, reply 19
		require.Equal(t, http.StatusOK, r.status)
		requireHeaders(t, r, map[string]string{
			"x-ratelimit-limit-tokens":     "300",
			"x-ratelimit-remaining-tokens": "181",
			"x-ratelimit-reset-tokens":     "23.8s",
		})
	})

	t.Run("ScaledMinuteRefillsExactly", func(t *testing.T) {
		t.Parallel()
		// Given 7 input tokens per second: one token every 142,857,142.857 ns
		b := setup(t, llmsim.Config{InputTokensPerMinute: 7, TokenMinute: time.Second})
		r := b.anthropic(t, "k", promptBody(28, 1))
		require.Equal(t, http.StatusOK, r.status)
		requireHeaders(t, r, map[string]string{
			"anthropic-ratelimit-input-tokens-limit":     "7",
			"anthropic-ratelimit-input-tokens-remaining": "0",
			"anthropic-ratelimit-input-tokens-reset":     "2026-01-02T03:04:06.000Z",
		})
		// When a nanosecond short of one token, a 1-token request is refused
		b.clock.Advance(142857142 * time.Nanosecond)
		r = b.anthropic(t, "k", promptBody(4, 1))
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "1", r.header.Get("retry-after"))
		// Then on the nanosecond it is admitted
		b.clock.Advance(time.Nanosecond)
		r = b.anthropic(t, "k", promptBody(4, 1))
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "0", r.header.Get("anthropic-ratelimit-input-tokens-remaining"))
	})

	t.Run("FailedAnswerReleasesReservation", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{OutputTokensPerMinute: 100, Faults: llmsim.Faults{FailNext: 1, FailNextStatus: 500}})
		r := b.anthropic(t, "k", promptBody(40, 50))
		require.Equal(t, http.StatusInternalServerError, r.status)
		require.Equal(t, "100", r.header.Get("anthropic-ratelimit-output-tokens-remaining"))
		// An invalid body draws nothing from the token buckets either
		r = b.anthropic(t, "k", `{"model":"m","max_tokens":50,"messages":"no"}`)
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Equal(t, "100", r.header.Get("anthropic-ratelimit-output-tokens-remaining"))
		st := b.sim.Stats()
		require.Equal(t, 10, st.InputTokens)
		require.Zero(t, st.OutputTokens)
	})

	t.Run("ClientGoneReleasesReservation", func(t *testing.T) {
		t.Parallel()
		// Given answers that wait an hour
		b := setup(t, llmsim.Config{OutputTokensPerMinute: 100, Latency: time.Hour})
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			_, err := b.do(t, ctx, http.MethodPost, "/v1/messages",
				map[string]string{"x-api-key": "k", "anthropic-version": "2023-06-01"}, promptBody(40, 60))
			errc <- err
		}()
		require.Eventually(t, func() bool { return b.sim.Stats().InFlight == 1 }, 30*time.Second, time.Millisecond)
		// When the client leaves during the wait
		cancel()
		require.Error(t, <-errc)
		require.Eventually(t, func() bool { return b.sim.Stats().ByStatus[llmsim.StatusClientClosed] == 1 }, 30*time.Second, time.Millisecond)
		// Then its reservation is back (the spend cap answers at once with the headers)
		require.NoError(t, b.sim.SetFaults(llmsim.Faults{SpendCap: true}))
		r := b.anthropic(t, "k", promptBody(40, 60))
		require.Equal(t, http.StatusTooManyRequests, r.status)
		require.Equal(t, "100", r.header.Get("anthropic-ratelimit-output-tokens-remaining"))
		require.Equal(t, 10, b.sim.Stats().InputTokens)
	})

	t.Run("InvalidMaxTokens", func(t *testing.T) {
		t.Parallel()
		body := `{"model":"m","max_tokens":"10","messages":[{"role":"user","content":"hi"}]}`
		// Without token limits max_tokens is ignored, as before
		b := setup(t, llmsim.Config{})
		require.Equal(t, http.StatusOK, b.anthropic(t, "k", body).status)
		// With them it must be a positive integer
		b = setup(t, llmsim.Config{InputTokensPerMinute: 100})
		for _, body := range []string{body, strings.Replace(body, `"10"`, "0", 1), strings.Replace(body, `"10"`, "1.5", 1)} {
			r := b.anthropic(t, "k", body)
			require.Equal(t, http.StatusBadRequest, r.status, body)
			require.Contains(t, errMessage(t, r), "max_tokens: must be a positive integer")
		}
		r := b.openai(t, "k", `{"model":"m","max_completion_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`)
		require.Equal(t, http.StatusBadRequest, r.status)
		require.Contains(t, errMessage(t, r), "max_completion_tokens: must be a positive integer")
	})

	t.Run("OffSendsNoTokenHeaders", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{Capacity: 5, RefillPerSecond: 1})
		for _, r := range []result{b.anthropic(t, "k", helloBody), b.openai(t, "k", helloBody)} {
			require.Equal(t, http.StatusOK, r.status)
			for k := range r.header {
				require.NotContains(t, strings.ToLower(k), "tokens", "header %s", k)
			}
		}
		require.NoError(t, b.sim.SetFaults(llmsim.Faults{SpendCap: true}))
		r := b.anthropic(t, "k", helloBody)
		require.Empty(t, r.header.Values("anthropic-ratelimit-tokens-limit"))
		st := b.sim.Stats()
		require.Zero(t, st.InputTokens)
		require.Zero(t, st.OutputTokens)
	})

	t.Run("ReplyTokensWithoutLimits", func(t *testing.T) {
		t.Parallel()
		// Given exactly 5 tokens (20 bytes) per reply and a prompt of 2-byte
		// runes, so that byte 20 falls inside one
		b := setup(t, llmsim.Config{ReplyTokens: 5})
		r := b.openai(t, "k", `{"model":"m","messages":[{"role":"user","content":"ééé"}]}`)
		require.Equal(t, http.StatusOK, r.status)
		// Then the reply is cut on the rune boundary and padded to 20 bytes
		msg := r.json(t)["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"].(string)
		require.Equal(t, "llmsim reply to: é ", msg)
		require.Equal(t, 5, outputTokens(t, r))
		require.Empty(t, r.header.Values("x-ratelimit-limit-tokens"))
		require.Zero(t, b.sim.Stats().OutputTokens)
	})

	t.Run("ResetRefillsTokenBuckets", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{InputTokensPerMinute: 100})
		require.Equal(t, http.StatusOK, b.anthropic(t, "k", promptBody(400, 1)).status)
		require.Equal(t, http.StatusTooManyRequests, b.anthropic(t, "k", promptBody(4, 1)).status)
		b.sim.Reset()
		require.Zero(t, b.sim.Stats().InputTokens)
		r := b.anthropic(t, "k", promptBody(4, 1))
		require.Equal(t, http.StatusOK, r.status)
		require.Equal(t, "99", r.header.Get("anthropic-ratelimit-input-tokens-remaining"))
	})

	t.Run("ConcurrentChargesAreExact", func(t *testing.T) {
		t.Parallel()
		// Given 100 input tokens and requests of 10
		b := setup(t, llmsim.Config{InputTokensPerMinute: 100})
		var (
			wg     sync.WaitGroup
			mu     sync.Mutex
			counts = map[int]int{}
		)
		for range 50 {
			wg.Go(func() {
				r, err := b.do(t, t.Context(), http.MethodPost, "/v1/messages",
					map[string]string{"x-api-key": "k", "anthropic-version": "2023-06-01"}, promptBody(40, 5))
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
		// Then exactly 10 are admitted
		require.Equal(t, map[int]int{200: 10, 429: 40}, counts)
		require.Equal(t, 100, b.sim.Stats().InputTokens)
	})
}

func TestConfig_ValidateTokens(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  llmsim.Config
		want string
	}{
		"Both":                {cfg: llmsim.Config{InputTokensPerMinute: 40000, OutputTokensPerMinute: 8000, TokenMinute: time.Second, ReplyTokens: 150}},
		"NegativeInput":       {cfg: llmsim.Config{InputTokensPerMinute: -1}, want: "input_tokens_per_minute"},
		"NegativeOutput":      {cfg: llmsim.Config{OutputTokensPerMinute: -1}, want: "output_tokens_per_minute"},
		"NegativeTokenMinute": {cfg: llmsim.Config{TokenMinute: -time.Second}, want: "token_minute"},
		"NegativeReplyTokens": {cfg: llmsim.Config{ReplyTokens: -1}, want: "reply_tokens"},
		"InputNotExact":       {cfg: llmsim.Config{InputTokensPerMinute: 1_000_000_007}, want: "input_tokens_per_minute: too large"},
		"OutputNotExact":      {cfg: llmsim.Config{OutputTokensPerMinute: 1 << 62}, want: "output_tokens_per_minute: too large"},
		"CombinedNotExact":    {cfg: llmsim.Config{InputTokensPerMinute: 1_000_000_000, OutputTokensPerMinute: 7}, want: "input_tokens_per_minute + output_tokens_per_minute"},
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

func TestSDK_TokenLimits(t *testing.T) {
	t.Parallel()

	t.Run("Anthropic", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{OutputTokensPerMinute: 100, ReplyTokens: 30})
		client := b.anthropicClient("sk-ant-test")
		for range 2 {
			msg, err := client.Messages.New(t.Context(), anthropicHello) // max_tokens 64
			require.NoError(t, err)
			require.Equal(t, int64(30), msg.Usage.OutputTokens)
			require.Len(t, msg.Content[0].Text, 120)
			require.Equal(t, anthropic.StopReasonEndTurn, msg.StopReason)
		}
		// 40 left, 64 needed: 24 tokens at 600 ms each
		_, err := client.Messages.New(t.Context(), anthropicHello)
		var apiErr *anthropic.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
		require.Equal(t, "rate_limit_error", string(apiErr.Type()))
		require.Equal(t, "15", apiErr.Response.Header.Get("retry-after"))
		require.Equal(t, "40", apiErr.Response.Header.Get("anthropic-ratelimit-output-tokens-remaining"))

		p := anthropicHello
		p.MaxTokens = 10
		msg, err := client.Messages.New(t.Context(), p)
		require.NoError(t, err)
		require.Equal(t, int64(10), msg.Usage.OutputTokens)
		require.Equal(t, anthropic.StopReasonMaxTokens, msg.StopReason)
	})

	t.Run("OpenAI", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{InputTokensPerMinute: 40, ReplyTokens: 5})
		client := b.openaiClient("sk-test")
		p := openaiHello
		p.MaxCompletionTokens = openai.Int(20)
		// 4 input + 20 reserved of 40 (one token per 1.5 s); trued up to 4 + 5
		c, err := client.Chat.Completions.New(t.Context(), p)
		require.NoError(t, err)
		require.Equal(t, int64(5), c.Usage.CompletionTokens)
		require.Equal(t, "stop", c.Choices[0].FinishReason)
		// 31 left: the second fits, the third (24 needed, 22 left) does not
		_, err = client.Chat.Completions.New(t.Context(), p)
		require.NoError(t, err)
		_, err = client.Chat.Completions.New(t.Context(), p)
		var apiErr *openai.Error
		require.ErrorAs(t, err, &apiErr)
		require.Equal(t, http.StatusTooManyRequests, apiErr.StatusCode)
		require.Equal(t, "tokens", apiErr.Type)
		require.Equal(t, "rate_limit_exceeded", apiErr.Code)
		require.Equal(t, "22", apiErr.Response.Header.Get("x-ratelimit-remaining-tokens"))
		require.Equal(t, "3", apiErr.Response.Header.Get("retry-after"))

		p.MaxCompletionTokens = openai.Int(2)
		c, err = client.Chat.Completions.New(t.Context(), p)
		require.NoError(t, err)
		require.Equal(t, int64(2), c.Usage.CompletionTokens)
		require.Equal(t, "length", c.Choices[0].FinishReason)
	})
}

// TestServer_ToolsAndToolResultsAreInput: the providers count a request's tool definitions and
// its tool results as input tokens; the simulator counts them by its rule too (the tools' JSON as
// sent, a tool_result's text as a text block's), as internal/tokens does, so that an agent's
// requests are charged what a provider charges.
func TestServer_ToolsAndToolResultsAreInput(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{})
	result := strings.Repeat("r", 800)
	tools := `[{"name":"search","input_schema":{"type":"object"}}]`
	body := `{"model":"m","max_tokens":5,"tools":` + tools + `,"messages":[{"role":"user","content":"1234"},
		{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"search","input":{}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"` + result + `"}]},
			{"type":"text","text":"go on"}]}]}`
	r := b.anthropic(t, "k", body)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	usage := r.json(t)["usage"].(map[string]any)
	require.EqualValues(t, (len(tools)+4+len("{}")+800+1+5)/4, usage["input_tokens"]) // the tool_use input too

	r = b.openai(t, "k", `{"model":"m","tools":`+tools+`,"messages":[{"role":"user","content":"1234"}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.EqualValues(t, (len(tools)+4)/4, r.json(t)["usage"].(map[string]any)["prompt_tokens"])
}

// TestServer_ToolsLayoutIsNotInput: the simulator charges a request's tool definitions as compact
// JSON, as internal/tokens counts them: the white space a client indents them with is not input.
func TestServer_ToolsLayoutIsNotInput(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{})
	compact := `[{"name":"search","input_schema":{"type":"object","properties":{"q":{"type":"string"}}}}]`
	indented := "[\n  {\n    \"name\": \"search\",\n    \"input_schema\": {\n      \"type\": \"object\",\n" +
		"      \"properties\": {\n        \"q\": { \"type\": \"string\" }\n      }\n    }\n  }\n]"
	r := b.anthropic(t, "k", `{"model":"m","max_tokens":5,"tools":`+indented+`,"messages":[{"role":"user","content":"1234"}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.EqualValues(t, (len(compact)+4)/4, r.json(t)["usage"].(map[string]any)["input_tokens"])
}

// TestServer_ToolCallsAndDocumentsAreInput: an assistant's tool calls (Anthropic's tool_use
// input as compact JSON, OpenAI's tool_calls name and arguments) and a document's text (a text
// source's data, a content source's text blocks) are input the providers charge; the simulator
// charges them by its rule, as internal/tokens counts them. A base64 document counts nothing.
func TestServer_ToolCallsAndDocumentsAreInput(t *testing.T) {
	t.Parallel()
	b := setup(t, llmsim.Config{})
	file := strings.Repeat("f", 800)
	input := `{"path":"a","text":"` + file + `"}`
	r := b.anthropic(t, "k", `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"1234"},
		{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"write","input": `+input+` }]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"ok"},
			{"type":"document","source":{"type":"text","media_type":"text/plain","data":"`+file+`"}},
			{"type":"document","source":{"type":"content","content":[{"type":"text","text":"`+file+`"}]}},
			{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"`+file+`"}}]}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.EqualValues(t, (4+len(input)+2+1+800+1+800)/4, r.json(t)["usage"].(map[string]any)["input_tokens"])

	args := strings.ReplaceAll(input, `"`, `\"`)
	r = b.openai(t, "k", `{"model":"m","messages":[{"role":"user","content":"1234"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"write","arguments":"`+args+`"}}]},
		{"role":"tool","tool_call_id":"c1","content":"ok"}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.EqualValues(t, (4+5+len(input)+2)/4, r.json(t)["usage"].(map[string]any)["prompt_tokens"])

	schema := `{"name":"a","schema":{"type":"object","description":"` + file + `"}}`
	r = b.openai(t, "k", `{"model":"m","response_format":{"type":"json_schema","json_schema": `+schema+` },"messages":[{"role":"user","content":"1234"}]}`)
	require.Equal(t, http.StatusOK, r.status, "%s", r.body)
	require.EqualValues(t, (4+len(schema))/4, r.json(t)["usage"].(map[string]any)["prompt_tokens"])
}
