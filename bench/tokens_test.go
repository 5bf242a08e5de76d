package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/tokens"
)

func TestTokenFloor(t *testing.T) {
	t.Parallel()
	tk, _ := parse[*tokensBench](t, "tokens")
	b := tk.buckets()
	require.Equal(t, []time.Duration{time.Second, 24 * time.Second, 5250 * time.Millisecond}, []time.Duration{b[0].time(), b[1].time(), b[2].time()},
		"(100 − 50) / 50; (200,000 − 40,000) / (40,000 / 6 s); (15,000 − 8,000) / (8,000 / 6 s): the reply, not max_tokens")
	floor, binding := tk.floor()
	require.Equal(t, 24*time.Second, floor)
	require.Equal(t, "input tokens", binding.name)

	tk, _ = parse[*tokensBench](t, "tokens", "-reply-tokens", "1000", "-max-tokens", "1000", "-input-tokens", "100", "-output-tpm", "8000")
	floor, binding = tk.floor()
	require.Equal(t, "output tokens", binding.name)
	require.Equal(t, 69*time.Second, floor, "(1,000 × 100 − 8,000) / (8,000 / 6 s)")

	tk, _ = parse[*tokensBench](t, "tokens", "-reply-tokens", "500")
	require.Equal(t, 200, tk.replyTokensPerJob(), "a reply is cut at max_tokens")
	require.Zero(t, floorBucket{charged: 10, capacity: 20, rate: 1}.time(), "the bucket holds it all")
}

func TestIsTokenHeader(t *testing.T) {
	t.Parallel()
	for name, want := range map[string]bool{
		"anthropic-ratelimit-input-tokens-limit":      true,
		"Anthropic-Ratelimit-Input-Tokens-Remaining":  true,
		"anthropic-ratelimit-output-tokens-reset":     true,
		"anthropic-ratelimit-tokens-limit":            true,
		"Anthropic-Ratelimit-Tokens-Remaining":        true,
		"x-ratelimit-limit-tokens":                    true,
		"X-Ratelimit-Remaining-Tokens":                true,
		"x-ratelimit-reset-tokens":                    true,
		"anthropic-ratelimit-requests-limit":          false,
		"anthropic-ratelimit-requests-remaining":      false,
		"x-ratelimit-limit-requests":                  false,
		"x-ratelimit-reset-requests":                  false,
		"retry-after":                                 false,
		"request-id":                                  false,
		"x-tokens":                                    false,
		"anthropic-ratelimit-input-tokens-limit-nope": true, // any *tokens-* of the family
	} {
		require.Equal(t, want, isTokenHeader(name), name)
	}
}

// simPost sends body to the simulator at url (Anthropic endpoint) and returns the answer's
// status and headers.
func simPost(t *testing.T, url string, body []byte) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/messages", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", "sk-test")
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header
}

func tokenHeaderNames(h http.Header) []string {
	var out []string
	for k := range h {
		if isTokenHeader(k) {
			out = append(out, k)
		}
	}
	return out
}

func TestHideTokenHeaders(t *testing.T) {
	t.Parallel()
	cfg := llmsim.Config{Capacity: 10, RefillPerSecond: 1, InputTokensPerMinute: 3000, OutputTokensPerMinute: 1000,
		TokenMinute: time.Hour, ReplyTokens: 50}
	body := tokensBody(0, 2000, 200)

	plain := httptest.NewServer(llmsim.New(cfg))
	defer plain.Close()
	status, h := simPost(t, plain.URL, body)
	require.Equal(t, http.StatusOK, status)
	require.Len(t, tokenHeaderNames(h), 9, "the simulator sends the input, output and tokens families: %v", h)

	hidden := httptest.NewServer(hideTokenHeaders(llmsim.New(cfg)))
	defer hidden.Close()
	status, h = simPost(t, hidden.URL, body)
	require.Equal(t, http.StatusOK, status)
	require.Empty(t, tokenHeaderNames(h))
	require.NotEmpty(t, h.Get("anthropic-ratelimit-requests-limit"), "request-limit headers pass")
	require.NotEmpty(t, h.Get("request-id"))

	// The second prompt does not fit the input bucket (1,000 left, refilling 3,000 an hour): 429
	// with Retry-After, and still no token headers.
	status, h = simPost(t, hidden.URL, tokensBody(1, 2000, 200))
	require.Equal(t, http.StatusTooManyRequests, status)
	require.NotEmpty(t, h.Get("retry-after"))
	require.Empty(t, tokenHeaderNames(h))
}

func TestTokenHeaderStripper_ImplicitHeader(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	hideTokenHeaders(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("x-ratelimit-remaining-tokens", "5")
		w.Header().Set("x-ratelimit-remaining-requests", "7")
		_, _ = w.Write([]byte("ok")) // no WriteHeader: the header is written by Write
		w.Header().Set("x-ratelimit-limit-tokens", "too late to matter")
	})).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	res := rec.Result()
	defer res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Empty(t, res.Header.Get("x-ratelimit-remaining-tokens"))
	require.Equal(t, "7", res.Header.Get("x-ratelimit-remaining-requests"))
	require.NoError(t, http.NewResponseController(rec).Flush(), "Unwrap reaches the flusher")
}

func TestTokensBody(t *testing.T) {
	t.Parallel()
	for _, in := range []int{1, 3, 2000} {
		body := tokensBody(42, in, 200)
		var req struct {
			MaxTokens int `json:"max_tokens"`
			Messages  []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(body, &req))
		require.Len(t, req.Messages, 1)
		require.Len(t, req.Messages[0].Content, 4*in, "exactly 4 bytes per input token")
		require.Equal(t, 200, req.MaxTokens)
		got, err := tokens.Count(tokens.ProviderAnthropic, body)
		require.NoError(t, err)
		require.Equal(t, in, got.Input, "llmq's fixed rule counts what the simulator charges")
		require.Equal(t, 200, got.MaxOutput)
	}
	require.True(t, strings.HasPrefix(string(tokensBody(7, 2000, 200)), `{"model":"claude-bench","max_tokens":200,"messages":[{"role":"user","content":"tokens request 7: `))
	require.NotEqual(t, tokensBody(1, 2000, 200), tokensBody(2, 2000, 200))
}
