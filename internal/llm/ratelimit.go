package llm

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// RateLimit is the provider's request rate-limit family, normalised across providers, and its
// token families in Tokens.
type RateLimit struct {
	// Known reports that both the request limit and the remaining count were present and valid.
	// When false, Limit, Remaining and the Reset fields are zero and must be ignored; Tokens is
	// parsed independently of it.
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
	// Tokens is the token rate-limit families; each is parsed on its own and is Known only when
	// its limit and remaining were present and valid.
	Tokens TokenRateLimits
	// Date is the response's Date header (the provider's clock, to the second) when the response
	// carried an absolute reset, here or in Tokens, and a valid Date; zero otherwise. An absolute
	// reset is measured from it: it is the provider's now on the same clock.
	Date time.Time
}

// header is h.Get(key) for a key already in canonical form (every key this file reads): the map
// lookup without Get's canonicalisation of the key, a scan of each of its bytes, which some dozen
// lookups an answer made a measurable part of a job's CPU (docs/benchmarks.md). h's keys are
// canonical when net/http built it, or http.Header's Set or Add.
func header(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// anthropicFamily is the canonical names of one Anthropic rate-limit family's headers.
type anthropicFamily struct{ limit, remaining, reset string }

// Anthropic's rate-limit families, spelt out rather than joined per answer.
var (
	anthropicRequests = anthropicFamily{"Anthropic-Ratelimit-Requests-Limit",
		"Anthropic-Ratelimit-Requests-Remaining", "Anthropic-Ratelimit-Requests-Reset"}
	anthropicInput = anthropicFamily{"Anthropic-Ratelimit-Input-Tokens-Limit",
		"Anthropic-Ratelimit-Input-Tokens-Remaining", "Anthropic-Ratelimit-Input-Tokens-Reset"}
	anthropicOutput = anthropicFamily{"Anthropic-Ratelimit-Output-Tokens-Limit",
		"Anthropic-Ratelimit-Output-Tokens-Remaining", "Anthropic-Ratelimit-Output-Tokens-Reset"}
	anthropicTokens = anthropicFamily{"Anthropic-Ratelimit-Tokens-Limit",
		"Anthropic-Ratelimit-Tokens-Remaining", "Anthropic-Ratelimit-Tokens-Reset"}
)

// parseAnthropicRateLimit reads anthropic-ratelimit-requests-{limit,remaining,reset}; reset
// is an RFC 3339 timestamp, fractional seconds allowed. With an absolute reset it reads Date.
func parseAnthropicRateLimit(h http.Header) RateLimit {
	rl, ok := parseLimitRemaining(header(h, anthropicRequests.limit), header(h, anthropicRequests.remaining))
	if ok {
		if v := strings.TrimSpace(header(h, anthropicRequests.reset)); v != "" {
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil && !t.IsZero() { // the zero time: no reset
				rl.ResetAt, rl.ResetAbsolute = t, true
			}
		}
	}
	rl.Tokens = parseAnthropicTokens(h)
	if t := rl.Tokens; rl.ResetAbsolute || t.Input.ResetAbsolute || t.Output.ResetAbsolute || t.Combined.ResetAbsolute {
		if d, err := http.ParseTime(strings.TrimSpace(header(h, "Date"))); err == nil {
			rl.Date = d
		}
	}
	return rl
}

// parseOpenAIRateLimit reads x-ratelimit-{limit,remaining}-requests and
// x-ratelimit-reset-requests; reset is a Go-style duration ("1s", "6m0s", "120ms",
// "1h2m3.5s") from received, the time the response headers arrived.
func parseOpenAIRateLimit(h http.Header, received time.Time) RateLimit {
	rl, ok := parseLimitRemaining(header(h, "X-Ratelimit-Limit-Requests"), header(h, "X-Ratelimit-Remaining-Requests"))
	if !ok {
		return RateLimit{Tokens: parseOpenAITokens(h, received)}
	}
	rl.Tokens = parseOpenAITokens(h, received)
	if v := strings.TrimSpace(header(h, "X-Ratelimit-Reset-Requests")); v != "" {
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
	limit, remaining = strings.TrimSpace(limit), strings.TrimSpace(remaining)
	if limit == "" || remaining == "" {
		return RateLimit{}, false // absent, the usual case: spared Atoi's error, an allocation
	}
	l, err := strconv.Atoi(limit)
	if err != nil || l < 0 {
		return RateLimit{}, false
	}
	r, err := strconv.Atoi(remaining)
	if err != nil || r < 0 {
		return RateLimit{}, false
	}
	return RateLimit{Known: true, Limit: l, Remaining: r}, true
}

// TokenRateLimits is the provider's token rate-limit families.
type TokenRateLimits struct {
	// Input is Anthropic's input-token bucket (anthropic-ratelimit-input-tokens-*).
	Input TokenRateLimit
	// Output is Anthropic's output-token bucket (anthropic-ratelimit-output-tokens-*).
	Output TokenRateLimit
	// Combined is OpenAI's token bucket, charged input and output tokens together
	// (x-ratelimit-{limit,remaining,reset}-tokens), or Anthropic's anthropic-ratelimit-tokens-*,
	// which reports the most restrictive of its token limits rather than a bucket of its own (do
	// not pace by it when Input and Output are known).
	Combined TokenRateLimit
}

// TokenRateLimit is one token rate-limit family: a bucket of Limit tokens, Remaining of them left,
// full again at ResetAt.
type TokenRateLimit struct {
	// Known reports that both the limit and the remaining count were present and valid. When
	// false, the other fields are zero and must be ignored.
	Known bool
	// Limit is the bucket's capacity in tokens (per minute).
	Limit int
	// Remaining is the tokens left; 0 is meaningful.
	Remaining int
	// RemainingGranularity is how coarsely Remaining is reported: Anthropic rounds it to the
	// nearest thousand (1000); 0 means exact (rounded down to a whole token).
	RemainingGranularity int
	// ResetAt is when the bucket is full again; zero when the reset header was absent or invalid.
	ResetAt time.Time
	// ResetAbsolute reports that ResetAt is a time read on the provider's clock (Anthropic), not a
	// duration added to our receive time (OpenAI).
	ResetAbsolute bool
	// ResetGranularity is how coarse ResetAt is, as for RateLimit.ResetGranularity.
	ResetGranularity time.Duration
}

// anthropicTokenRounding is how Anthropic rounds the remaining tokens it reports (to the nearest
// thousand, per its rate-limit documentation).
const anthropicTokenRounding = 1000

// parseAnthropicTokens reads anthropic-ratelimit-{input-tokens,output-tokens,tokens}-{limit,
// remaining,reset}; reset is an RFC 3339 timestamp.
func parseAnthropicTokens(h http.Header) TokenRateLimits {
	family := func(names anthropicFamily) TokenRateLimit {
		tl, ok := parseTokenLimitRemaining(header(h, names.limit), header(h, names.remaining))
		if !ok {
			return TokenRateLimit{}
		}
		tl.RemainingGranularity = anthropicTokenRounding
		if v := strings.TrimSpace(header(h, names.reset)); v != "" {
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil && !t.IsZero() { // the zero time: no reset
				tl.ResetAt, tl.ResetAbsolute = t, true
			}
		}
		return tl
	}
	return TokenRateLimits{Input: family(anthropicInput), Output: family(anthropicOutput), Combined: family(anthropicTokens)}
}

// parseOpenAITokens reads x-ratelimit-{limit,remaining}-tokens and x-ratelimit-reset-tokens, a
// Go-style duration from received.
func parseOpenAITokens(h http.Header, received time.Time) TokenRateLimits {
	tl, ok := parseTokenLimitRemaining(header(h, "X-Ratelimit-Limit-Tokens"), header(h, "X-Ratelimit-Remaining-Tokens"))
	if !ok {
		return TokenRateLimits{}
	}
	if v := strings.TrimSpace(header(h, "X-Ratelimit-Reset-Tokens")); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			tl.ResetAt = received.Add(d)
			tl.ResetGranularity = time.Millisecond
			if d >= time.Second && d%time.Second == 0 {
				tl.ResetGranularity = time.Second
			}
		}
	}
	return TokenRateLimits{Combined: tl}
}

func parseTokenLimitRemaining(limit, remaining string) (TokenRateLimit, bool) {
	rl, ok := parseLimitRemaining(limit, remaining)
	if !ok {
		return TokenRateLimit{}, false
	}
	return TokenRateLimit{Known: true, Limit: rl.Limit, Remaining: rl.Remaining}, true
}
