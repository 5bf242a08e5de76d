package llm

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRateLimitHeaders_NoAllocations: reading either provider's rate-limit headers allocates
// nothing, whether the answer carries them or not (the header names were joined per family and
// answer: nine strings an Anthropic answer), and reads what http.Header.Get reads.
func TestRateLimitHeaders_NoAllocations(t *testing.T) {
	received := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	plain := http.Header{}
	plain.Set("Content-Type", "application/json")
	plain.Set("Date", "Sun, 01 Mar 2026 12:00:00 GMT")
	anthropic := plain.Clone()
	for _, f := range []string{"requests", "input-tokens", "output-tokens", "tokens"} {
		anthropic.Set("anthropic-ratelimit-"+f+"-limit", "50000")
		anthropic.Set("anthropic-ratelimit-"+f+"-remaining", "49000")
		anthropic.Set("anthropic-ratelimit-"+f+"-reset", "2026-03-01T12:00:01Z")
	}
	openai := plain.Clone()
	for _, f := range []string{"requests", "tokens"} {
		openai.Set("x-ratelimit-limit-"+f, "60")
		openai.Set("x-ratelimit-remaining-"+f, "59")
		openai.Set("x-ratelimit-reset-"+f, "1.5s")
	}
	for name, h := range map[string]http.Header{"plain": plain, "anthropic": anthropic, "openai": openai} {
		var a, o RateLimit
		allocs := testing.AllocsPerRun(50, func() {
			a = parseAnthropicRateLimit(h)
			o = parseOpenAIRateLimit(h, received)
		})
		require.Zero(t, allocs, "%s: allocations per answer", name)
		switch name {
		case "anthropic":
			require.True(t, a.Known && a.Tokens.Input.Known && a.Tokens.Output.Known && a.Tokens.Combined.Known, "%+v", a)
			require.Equal(t, received, a.Date.UTC())
			require.False(t, o.Known || o.Tokens.Combined.Known)
		case "openai":
			require.True(t, o.Known && o.Tokens.Combined.Known, "%+v", o)
			require.Equal(t, received.Add(1500*time.Millisecond), o.ResetAt)
			require.False(t, a.Known || a.Tokens != (TokenRateLimits{}))
		default:
			require.Equal(t, RateLimit{}, a)
			require.Equal(t, RateLimit{}, o)
		}
	}
	for _, key := range []string{anthropicRequests.limit, anthropicInput.reset, anthropicOutput.remaining,
		anthropicTokens.limit, "Date", "X-Ratelimit-Reset-Tokens", "Missing"} {
		require.Equal(t, anthropic.Get(key)+openai.Get(key), header(anthropic, key)+header(openai, key), key)
		require.Equal(t, http.CanonicalHeaderKey(key), key, "a key header reads must be canonical")
	}
}
