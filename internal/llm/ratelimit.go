package llm

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RateLimit is the provider's request rate-limit family, normalised across providers. The
// token families (input/output tokens) are left in the response header.
type RateLimit struct {
	// Known reports that both the limit and the remaining count were present and valid.
	// When false, the other fields are zero and must be ignored.
	Known bool
	// Limit is the number of requests allowed in the provider's window.
	Limit int
	// Remaining is the number of requests left in the window; 0 is meaningful.
	Remaining int
	// ResetAt is when the window refills; zero when the reset header was absent or invalid.
	ResetAt time.Time
	// ResetAbsolute reports that ResetAt is a time read on the provider's clock (Anthropic's
	// RFC 3339 reset), as opposed to a duration added to our receive time (OpenAI's).
	ResetAbsolute bool
	// ResetGranularity is how coarse ResetAt is: 1s for a whole-second OpenAI duration ("2s"),
	// 1ms for a finer one ("1.953s", "12ms"); 0 for Anthropic (whole seconds in the text mean
	// whole-second precision, fractions mean exact).
	ResetGranularity time.Duration
}

// parseAnthropicRateLimit reads anthropic-ratelimit-requests-{limit,remaining,reset}; reset
// is an RFC 3339 timestamp, fractional seconds allowed.
func parseAnthropicRateLimit(h http.Header) RateLimit {
	rl, ok := parseLimitRemaining(h.Get("Anthropic-Ratelimit-Requests-Limit"), h.Get("Anthropic-Ratelimit-Requests-Remaining"))
	if !ok {
		return RateLimit{}
	}
	if v := strings.TrimSpace(h.Get("Anthropic-Ratelimit-Requests-Reset")); v != "" {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			rl.ResetAt, rl.ResetAbsolute = t, true
		}
	}
	return rl
}

// parseOpenAIRateLimit reads x-ratelimit-{limit,remaining}-requests and
// x-ratelimit-reset-requests; reset is a Go-style duration ("1s", "6m0s", "120ms",
// "1h2m3.5s") from received, the time the response headers arrived.
func parseOpenAIRateLimit(h http.Header, received time.Time) RateLimit {
	rl, ok := parseLimitRemaining(h.Get("X-Ratelimit-Limit-Requests"), h.Get("X-Ratelimit-Remaining-Requests"))
	if !ok {
		return RateLimit{}
	}
	if v := strings.TrimSpace(h.Get("X-Ratelimit-Reset-Requests")); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			rl.ResetAt = received.Add(d)
			rl.ResetGranularity = time.Millisecond
			if d >= time.Second && d%time.Second == 0 {
				rl.ResetGranularity = time.Second
			}
		}
	}
	return rl
}

func parseLimitRemaining(limit, remaining string) (RateLimit, bool) {
	l, err := strconv.Atoi(strings.TrimSpace(limit))
	if err != nil || l < 0 {
		return RateLimit{}, false
	}
	r, err := strconv.Atoi(strings.TrimSpace(remaining))
	if err != nil || r < 0 {
		return RateLimit{}, false
	}
	return RateLimit{Known: true, Limit: l, Remaining: r}, true
}
