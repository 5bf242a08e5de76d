package llm

import (
	"net/http"
	"testing"
	"time"
)

// FuzzRateLimitHeaders feeds both providers' rate-limit header parsers arbitrary limit,
// remaining and reset values and receive times. They must never panic, never report a negative
// limit or remaining count, report nothing but Known=false when they refuse the pair, and never
// place an OpenAI reset (a duration from the receive time) before the receive time. The
// committed corpus is in testdata/fuzz/FuzzRateLimitHeaders.
func FuzzRateLimitHeaders(f *testing.F) {
	for _, s := range []struct{ limit, remaining, reset string }{
		{"50", "49", "2026-01-02T03:04:05Z"},
		{"50", "0", "2026-01-02T03:04:05.123456Z"},
		{"10000", "9999", "6m0s"},
		{"60", "59", "1.953s"},
		{"60", "59", "120ms"},
		{"", "", ""},
		{"x", "1", "soon"},
	} {
		f.Add(s.limit, s.remaining, s.reset, int64(1_767_225_600_000_000_000))
	}
	f.Fuzz(func(t *testing.T, limit, remaining, reset string, receivedNanos int64) {
		received := time.Unix(0, receivedNanos)

		a := parseAnthropicRateLimit(http.Header{
			"Anthropic-Ratelimit-Requests-Limit":     {limit},
			"Anthropic-Ratelimit-Requests-Remaining": {remaining},
			"Anthropic-Ratelimit-Requests-Reset":     {reset},
		})
		checkRateLimit(t, "anthropic", a)
		if a.ResetAbsolute != !a.ResetAt.IsZero() || a.ResetGranularity != 0 {
			t.Fatalf("anthropic reset %v absolute %v granularity %s", a.ResetAt, a.ResetAbsolute, a.ResetGranularity)
		}

		o := parseOpenAIRateLimit(http.Header{
			"X-Ratelimit-Limit-Requests":     {limit},
			"X-Ratelimit-Remaining-Requests": {remaining},
			"X-Ratelimit-Reset-Requests":     {reset},
		}, received)
		checkRateLimit(t, "openai", o)
		if o.ResetAbsolute {
			t.Fatalf("openai reset marked absolute")
		}
		if o.ResetAt.IsZero() != (o.ResetGranularity == 0) {
			t.Fatalf("openai reset %v with granularity %s", o.ResetAt, o.ResetGranularity)
		}
		if !o.ResetAt.IsZero() {
			if o.ResetAt.Before(received) {
				t.Fatalf("openai reset %v before receipt %v (header %q)", o.ResetAt, received, reset)
			}
			if g := o.ResetGranularity; g != time.Millisecond && g != time.Second {
				t.Fatalf("openai granularity %s", g)
			}
		}
	})
}

func checkRateLimit(t *testing.T, provider string, rl RateLimit) {
	t.Helper()
	if rl.Limit < 0 || rl.Remaining < 0 {
		t.Fatalf("%s: negative limit %d or remaining %d", provider, rl.Limit, rl.Remaining)
	}
	if !rl.Known && rl != (RateLimit{}) {
		t.Fatalf("%s: not known but %+v", provider, rl)
	}
}
