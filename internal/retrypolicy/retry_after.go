package retrypolicy

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxRetryAfter is the longest wait ParseRetryAfter returns. A server hint above it (or a
// far-future date, or a number too large to represent) is clamped to it: an hour is already
// far beyond any rate-limit window of the providers we call, and an unbounded value would
// park a job forever on a typo. What a Policy honours is capped lower still
// (Config.MaxRetryAfter, 5 minutes by default).
const MaxRetryAfter = time.Hour

// maxRetryAfterValueLen bounds Decision.RetryAfterValue: it is for a log line.
const maxRetryAfterValueLen = 64

// ParseRetryAfter returns how long the response headers h ask the client to wait, measured
// from now, and whether they held a usable hint. An HTTP-date is measured from the response's
// Date header when it has a valid one (the provider's clock, as the date is), else from now.
//
// It reads, in order:
//   - retry-after-ms: milliseconds as a non-negative decimal ("1500", "20.5");
//   - Retry-After as delay-seconds: a non-negative decimal ("2", "1.5"; RFC 9110 allows only
//     integers, decimals are accepted because some servers send them);
//   - Retry-After as an HTTP-date in any of the three RFC 9110 forms (IMF-fixdate, RFC 850,
//     asctime), via http.ParseTime.
//
// retry-after-ms wins when both headers are present and it is valid; an invalid
// retry-after-ms falls back to Retry-After. Signs, exponents, NaN, Inf, empty and otherwise
// malformed values are not hints (0, false). A date in the past yields (0, true): the server
// gave a hint and it says "now". The result is never negative and never above MaxRetryAfter.
// Header names are matched case-insensitively even in a hand-built, non-canonical header map.
func ParseRetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if v, ok := headerValue(h, "Retry-After-Ms"); ok {
		if ms, ok := parseDecimal(v); ok {
			return fromFloat(ms, float64(time.Millisecond)), true
		}
	}
	v, ok := headerValue(h, "Retry-After")
	if !ok {
		return 0, false
	}
	if secs, ok := parseDecimal(v); ok {
		return fromFloat(secs, float64(time.Second)), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	// The date is on the provider's clock: the response's Date, on the same clock, says how far
	// off it is. Measured from now, a host clock running ahead of the provider's would wait less
	// than asked, and send again into the limit (the shared limiter's push-back with it).
	if dv, ok := headerValue(h, "Date"); ok {
		if date, err := http.ParseTime(dv); err == nil {
			now = date
		}
	}
	d := t.Sub(now)
	switch {
	case d < 0:
		return 0, true
	case d > MaxRetryAfter:
		return MaxRetryAfter, true
	default:
		return d, true
	}
}

// malformedRetryAfter reports whether h carries Retry-After or retry-after-ms (with any value,
// empty included) and returns the value of the first present, cut to maxRetryAfterValueLen
// bytes. Call it when ParseRetryAfter found no usable hint: the header is then malformed.
func malformedRetryAfter(h http.Header) (string, bool) {
	for _, name := range []string{"Retry-After", "Retry-After-Ms"} {
		for k, vs := range h {
			if strings.EqualFold(k, name) {
				var v string
				if len(vs) > 0 {
					v = vs[0]
				}
				if len(v) > maxRetryAfterValueLen {
					cut := maxRetryAfterValueLen
					for cut > 0 && !utf8.RuneStart(v[cut]) {
						cut--
					}
					v = v[:cut] + "…"
				}
				return v, true
			}
		}
	}
	return "", false
}

// headerValue returns the first non-empty value of name, trimmed, matching the name
// case-insensitively: of several header lines, the first that says something.
func headerValue(h http.Header, name string) (string, bool) {
	if h == nil {
		return "", false
	}
	if v := strings.TrimSpace(h.Get(name)); v != "" {
		return v, true
	}
	for k, vs := range h {
		if strings.EqualFold(k, name) {
			for _, v := range vs {
				if v = strings.TrimSpace(v); v != "" {
					return v, true
				}
			}
		}
	}
	return "", false
}

// parseDecimal accepts only digits with at most one decimal point and at least one digit:
// no sign, no exponent, no hex, no NaN/Inf (all of which strconv.ParseFloat would take).
func parseDecimal(s string) (float64, bool) {
	digits, dots := 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.':
			dots++
		default:
			return 0, false
		}
	}
	if digits == 0 || dots > 1 {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 1) { // a value out of range is +Inf: clamp, do not reject
		return 0, false
	}
	return f, true
}

// fromFloat converts n units to a duration in [0, MaxRetryAfter] without overflowing.
func fromFloat(n, unit float64) time.Duration {
	ns := n * unit
	if ns >= float64(MaxRetryAfter) || math.IsInf(ns, 1) {
		return MaxRetryAfter
	}
	if ns <= 0 || math.IsNaN(ns) {
		return 0
	}
	return time.Duration(ns)
}
