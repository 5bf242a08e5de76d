package llm_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
)

func TestProvider_Send_TokenRateLimit(t *testing.T) {
	t.Parallel()

	anthropicFamily := func(family, limit, remaining, reset string) []string {
		p := "anthropic-ratelimit-" + family + "-"
		return []string{p + "limit", limit, p + "remaining", remaining, p + "reset", reset}
	}
	concat := func(kvs ...[]string) []string {
		var out []string
		for _, kv := range kvs {
			out = append(out, kv...)
		}
		return out
	}
	anthropic := func(limit, remaining int, resetAt time.Time) llm.TokenRateLimit {
		return llm.TokenRateLimit{Known: true, Limit: limit, Remaining: remaining, RemainingGranularity: 1000,
			ResetAt: resetAt, ResetAbsolute: true}
	}
	tests := []struct {
		name string
		kind llm.Kind
		kv   []string
		want llm.RateLimit
	}{
		{
			name: "AnthropicAllFamilies", kind: llm.KindAnthropic,
			kv: concat(
				anthropicFamily("requests", "50", "49", "2026-03-01T12:00:01Z"),
				anthropicFamily("input-tokens", "40000", "38000", "2026-03-01T12:00:03Z"),
				anthropicFamily("output-tokens", "8000", "7800", "2026-03-01T12:00:01.5Z"),
				anthropicFamily("tokens", "48000", "45800", "2026-03-01T12:00:03Z")),
			want: llm.RateLimit{Known: true, Limit: 50, Remaining: 49, ResetAt: testNow.Add(time.Second), ResetAbsolute: true,
				Date: testNow, // the response's Date: absolute resets are measured from it
				Tokens: llm.TokenRateLimits{
					Input:    anthropic(40000, 38000, testNow.Add(3*time.Second)),
					Output:   anthropic(8000, 7800, testNow.Add(1500*time.Millisecond)),
					Combined: anthropic(48000, 45800, testNow.Add(3*time.Second)),
				}},
		},
		{
			// The token families are parsed on their own: no request family needed.
			name: "AnthropicTokensOnly", kind: llm.KindAnthropic,
			kv:   anthropicFamily("input-tokens", "40000", "0", "2026-03-01T12:01:00Z"),
			want: llm.RateLimit{Tokens: llm.TokenRateLimits{Input: anthropic(40000, 0, testNow.Add(time.Minute))}, Date: testNow},
		},
		{
			name: "AnthropicGarbageReset", kind: llm.KindAnthropic,
			kv: anthropicFamily("output-tokens", "8000", "10", "soon"),
			want: llm.RateLimit{Tokens: llm.TokenRateLimits{Output: llm.TokenRateLimit{Known: true, Limit: 8000, Remaining: 10,
				RemainingGranularity: 1000}}},
		},
		{
			name: "AnthropicMissingRemaining", kind: llm.KindAnthropic,
			kv:   []string{"anthropic-ratelimit-input-tokens-limit", "40000"},
			want: llm.RateLimit{},
		},
		{
			name: "AnthropicNegative", kind: llm.KindAnthropic,
			kv:   anthropicFamily("input-tokens", "40000", "-5", "2026-03-01T12:01:00Z"),
			want: llm.RateLimit{},
		},
		{
			name: "AnthropicIgnoresOpenAIHeaders", kind: llm.KindAnthropic,
			kv:   []string{"x-ratelimit-limit-tokens", "40000", "x-ratelimit-remaining-tokens", "100"},
			want: llm.RateLimit{},
		},
		{
			name: "OpenAITokens", kind: llm.KindOpenAI,
			kv: []string{"x-ratelimit-limit-requests", "60", "x-ratelimit-remaining-requests", "59", "x-ratelimit-reset-requests", "1s",
				"x-ratelimit-limit-tokens", "150000", "x-ratelimit-remaining-tokens", "149984", "x-ratelimit-reset-tokens", "6ms"},
			want: llm.RateLimit{Known: true, Limit: 60, Remaining: 59, ResetAt: testNow.Add(time.Second), ResetGranularity: time.Second,
				Tokens: llm.TokenRateLimits{Combined: llm.TokenRateLimit{Known: true, Limit: 150000, Remaining: 149984,
					ResetAt: testNow.Add(6 * time.Millisecond), ResetGranularity: time.Millisecond}}},
		},
		{
			name: "OpenAITokensWholeSeconds", kind: llm.KindOpenAI,
			kv: []string{"x-ratelimit-limit-tokens", "40000", "x-ratelimit-remaining-tokens", "0", "x-ratelimit-reset-tokens", "1m0s"},
			want: llm.RateLimit{Tokens: llm.TokenRateLimits{Combined: llm.TokenRateLimit{Known: true, Limit: 40000,
				ResetAt: testNow.Add(time.Minute), ResetGranularity: time.Second}}},
		},
		{
			name: "OpenAIGarbageReset", kind: llm.KindOpenAI,
			kv:   []string{"x-ratelimit-limit-tokens", "40000", "x-ratelimit-remaining-tokens", "3", "x-ratelimit-reset-tokens", "-2s"},
			want: llm.RateLimit{Tokens: llm.TokenRateLimits{Combined: llm.TokenRateLimit{Known: true, Limit: 40000, Remaining: 3}}},
		},
		{
			name: "OpenAIGarbageLimit", kind: llm.KindOpenAI,
			kv:   []string{"x-ratelimit-limit-tokens", "lots", "x-ratelimit-remaining-tokens", "3"},
			want: llm.RateLimit{},
		},
		{
			name: "OpenAIIgnoresAnthropicHeaders", kind: llm.KindOpenAI,
			kv:   anthropicFamily("input-tokens", "40000", "100", "2026-03-01T12:01:00Z"),
			want: llm.RateLimit{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			b := setup(t, tt.kind, reply(200, `{}`, tt.kv...), bundleOpts{now: fixedClock})
			resp, err := b.provider.Send(t.Context(), bodyFor(tt.kind), llm.SendOptions{})
			require.NoError(t, err)
			requireRateLimit(t, tt.want, resp.RateLimit)
		})
	}

	t.Run("OnStatusError", func(t *testing.T) {
		t.Parallel()

		kv := append([]string{"retry-after", "2"}, anthropicFamily("output-tokens", "8000", "0", "2026-03-01T12:00:02Z")...)
		b := setup(t, llm.KindAnthropic, reply(429, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`, kv...),
			bundleOpts{now: fixedClock})
		_, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		se := asStatusError(t, err)
		requireRateLimit(t, llm.RateLimit{Tokens: llm.TokenRateLimits{Output: anthropic(8000, 0, testNow.Add(2*time.Second))},
			Date: testNow}, se.RateLimit)
	})
}

// requireRateLimit compares rate limits, times by instant.
func requireRateLimit(t *testing.T, want, got llm.RateLimit) {
	t.Helper()
	norm := func(rl llm.RateLimit) llm.RateLimit {
		at := func(x time.Time) time.Time {
			if x.IsZero() {
				return time.Time{}
			}
			return x.UTC()
		}
		rl.ResetAt = at(rl.ResetAt)
		rl.Tokens.Input.ResetAt = at(rl.Tokens.Input.ResetAt)
		rl.Tokens.Output.ResetAt = at(rl.Tokens.Output.ResetAt)
		rl.Tokens.Combined.ResetAt = at(rl.Tokens.Combined.ResetAt)
		rl.Date = at(rl.Date)
		return rl
	}
	require.Equal(t, norm(want), norm(got))
}
