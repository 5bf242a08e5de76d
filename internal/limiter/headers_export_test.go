// ObservationFromHeaders lives in a test file: production code builds observations from llm.RateLimit
// (internal/jobs), which parses the same headers once; the limiter's tests use this to feed responses.

package limiter

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Rate-limit response headers understood by ObservationFromHeaders.
const (
	// Anthropic: limit and remaining are integers, reset is an RFC 3339 time at which the bucket
	// is full again.
	HeaderAnthropicLimit     = "anthropic-ratelimit-requests-limit"
	HeaderAnthropicRemaining = "anthropic-ratelimit-requests-remaining"
	HeaderAnthropicReset     = "anthropic-ratelimit-requests-reset"
	// OpenAI: limit and remaining are integers, reset is a duration until the bucket is full
	// again ("12ms", "1.5s", "6m0s").
	HeaderOpenAILimit     = "x-ratelimit-limit-requests"
	HeaderOpenAIRemaining = "x-ratelimit-remaining-requests"
	HeaderOpenAIReset     = "x-ratelimit-reset-requests"
	// HeaderRetryAfterMs is OpenAI's millisecond Retry-After; it wins over Retry-After.
	HeaderRetryAfterMs = "retry-after-ms"
	// Token families: Anthropic's anthropic-ratelimit-{input-tokens,output-tokens}-{limit,
	// remaining,reset} (remaining rounded to the nearest thousand, reset an RFC 3339 time) and
	// OpenAI's x-ratelimit-{limit,remaining,reset}-tokens (reset a duration).
	HeaderAnthropicInputTokensPrefix  = "anthropic-ratelimit-input-tokens-"
	HeaderAnthropicOutputTokensPrefix = "anthropic-ratelimit-output-tokens-"
	HeaderOpenAILimitTokens           = "x-ratelimit-limit-tokens"
	HeaderOpenAIRemainingTokens       = "x-ratelimit-remaining-tokens"
	HeaderOpenAIResetTokens           = "x-ratelimit-reset-tokens"
)

// ObservationFromHeaders reads the request and token rate-limit headers of either provider family,
// Date (with an absolute reset), and Retry-After (seconds or HTTP-date) or retry-after-ms, from a response with the given status
// that was sent at sentAt and arrived at at. HeadersKnown is set only when limit, remaining and
// reset all parse; a malformed header is ignored, never an error.
func ObservationFromHeaders(h http.Header, status int, sentAt, at time.Time) Observation {
	o := Observation{At: at, SentAt: sentAt, StatusCode: status}
	if lim, rem, ok := limitRemaining(h, HeaderAnthropicLimit, HeaderAnthropicRemaining); ok {
		if reset, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(h.Get(HeaderAnthropicReset))); err == nil {
			o.HeadersKnown, o.Limit, o.Remaining, o.ResetAt = true, lim, rem, reset
			o.ResetAbsolute = true
		}
	} else if lim, rem, ok := limitRemaining(h, HeaderOpenAILimit, HeaderOpenAIRemaining); ok {
		if d, err := time.ParseDuration(strings.TrimSpace(h.Get(HeaderOpenAIReset))); err == nil && d >= 0 {
			o.HeadersKnown, o.Limit, o.Remaining, o.ResetAt = true, lim, rem, at.Add(d)
			// "2s" is as coarse as a second; "1.953s" or "12ms" are to the millisecond.
			o.ResetGranularity = time.Millisecond
			if d >= time.Second && d%time.Second == 0 {
				o.ResetGranularity = time.Second
			}
		}
	}
	anthropicTokens := func(prefix string) TokenObservation {
		lim, rem, ok := limitRemaining(h, prefix+"limit", prefix+"remaining")
		if !ok {
			return TokenObservation{}
		}
		t := TokenObservation{Known: true, Limit: lim, Remaining: rem, RemainingGranularity: 1000}
		if reset, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(h.Get(prefix+"reset"))); err == nil {
			t.ResetAt, t.ResetAbsolute = reset, true
		}
		return t
	}
	o.InputTokens = anthropicTokens(HeaderAnthropicInputTokensPrefix)
	o.OutputTokens = anthropicTokens(HeaderAnthropicOutputTokensPrefix)
	if o.ResetAbsolute || o.InputTokens.ResetAbsolute || o.OutputTokens.ResetAbsolute {
		if d, err := http.ParseTime(strings.TrimSpace(h.Get("Date"))); err == nil {
			o.Date = d
		}
	}
	if lim, rem, ok := limitRemaining(h, HeaderOpenAILimitTokens, HeaderOpenAIRemainingTokens); ok {
		o.Tokens = TokenObservation{Known: true, Limit: lim, Remaining: rem}
		if d, err := time.ParseDuration(strings.TrimSpace(h.Get(HeaderOpenAIResetTokens))); err == nil && d >= 0 {
			o.Tokens.ResetAt = at.Add(d)
			o.Tokens.ResetGranularity = time.Millisecond
			if d >= time.Second && d%time.Second == 0 {
				o.Tokens.ResetGranularity = time.Second
			}
		}
	}
	if ms, err := strconv.ParseFloat(strings.TrimSpace(h.Get(HeaderRetryAfterMs)), 64); err == nil && ms >= 0 {
		o.RetryAfter, o.HasRetryAfter = time.Duration(ms*float64(time.Millisecond)), true
	} else if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
			o.RetryAfter, o.HasRetryAfter = time.Duration(s*float64(time.Second)), true
		} else if t, err := http.ParseTime(v); err == nil {
			o.RetryAfter, o.HasRetryAfter = max(t.Sub(at), 0), true
		}
	}
	return o
}

func limitRemaining(h http.Header, limitName, remainingName string) (limit, remaining int, ok bool) {
	l, err1 := strconv.Atoi(strings.TrimSpace(h.Get(limitName)))
	r, err2 := strconv.Atoi(strings.TrimSpace(h.Get(remainingName)))
	if err1 != nil || err2 != nil || l <= 0 || r < 0 {
		return 0, 0, false
	}
	return l, r, true
}
