package retrypolicy

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
)

// Class names what kind of failure an attempt ended with. Its values are stable strings,
// fit to be stored and used as metric labels.
type Class string

// The classes Classify returns; the package documentation gives the precedence.
const (
	// ClassOK is a nil error.
	ClassOK Class = "ok"
	// ClassRetryable is a transient provider failure: 408, 409, 500, 502, 503, 504, 529, a 429
	// whose Retry-After is malformed ("retry later, no hint"), or any status the provider
	// marked x-should-retry: true.
	ClassRetryable Class = "retryable"
	// ClassRateLimited is a 429 that carried a usable Retry-After or retry-after-ms.
	ClassRateLimited Class = "rate_limited"
	// ClassSpendCap is a 429 without any Retry-After header or a spend/billing error code: it
	// keeps failing until an operator acts, so the job goes dead.
	ClassSpendCap Class = "spend_cap"
	// ClassTimeout is a timeout: a deadline passed or the transport timed out.
	ClassTimeout Class = "timeout"
	// ClassNetwork is any other transport failure (refused, reset, DNS, TLS, short body).
	ClassNetwork Class = "network"
	// ClassPermanent is a provider answer that retrying cannot fix (400, 401, 403, 404, 413,
	// 422, any status not in the table, x-should-retry: false).
	ClassPermanent Class = "permanent"
	// ClassInternal is our own bug: an error with no provider or transport facts, such as a
	// response we failed to decode.
	ClassInternal Class = "internal"
	// ClassCanceled is context.Canceled: the job or the process is being stopped.
	ClassCanceled Class = "canceled"
)

// DeadReasonRateLimitedNoRetryAfter is Decision.DeadReason for ClassSpendCap.
const DeadReasonRateLimitedNoRetryAfter = "rate_limited_no_retry_after"

// Decision is the outcome of Classify.
type Decision struct {
	// Class is the failure class.
	Class Class
	// Retry reports whether another attempt may help. It is true exactly for retryable,
	// rate_limited, timeout and network.
	Retry bool
	// DeadReason is DeadReasonRateLimitedNoRetryAfter for spend_cap and "" otherwise: a
	// non-empty reason means "dead-letter and alert", not merely "failed".
	DeadReason string
	// StatusCode is the provider's HTTP status, or 0 when the error carries none.
	StatusCode int
	// RetryAfter is the server's wait hint, valid when HasRetryAfter; it is filled for any
	// error that carries response headers, whatever its class.
	RetryAfter time.Duration
	// HasRetryAfter reports whether the response carried a usable Retry-After or
	// retry-after-ms.
	HasRetryAfter bool
	// MalformedRetryAfter reports a Retry-After (or retry-after-ms) header that was present but
	// unusable: negative, not a number ("abc", "1s"), empty, or a date in none of the RFC 9110
	// forms. The server wants a retry and gave no usable hint: on a 429 the class is
	// retryable (full jitter), never spend_cap.
	MalformedRetryAfter bool
	// RetryAfterValue is the malformed header's value, for a log line: cut to 64 bytes, and
	// only as clean as the header the error carried (internal/llm redacts the key from it).
	RetryAfterValue string
	// TooLarge reports a provider's refusal of the request as too large for it (a 413, a
	// context window exceeded): never retried on this credential (the class is permanent),
	// but another credential, with another model or larger limits, may take it.
	TooLarge bool
}

// The interfaces embed error so that errors.AsType can look for them; any error in the chain
// that has the method matches.
type httpStatuser interface {
	error
	HTTPStatus() int
}

type responseHeaderer interface {
	error
	ResponseHeader() http.Header
}

type errorTyper interface {
	error
	ErrorType() string
}

type timeouter interface {
	error
	Timeout() bool
}

type tooLarger interface {
	error
	TooLarge() bool
}

// spendCapCodes are provider error codes/types that mean money, not load: OpenAI
// insufficient_quota and billing_*, Anthropic billing_error (402) and the 429 whose
// error.details.error_code is enforced_spend_limit_reached.
var spendCapCodes = map[string]bool{
	"insufficient_quota":           true,
	"billing_error":                true,
	"billing_hard_limit_reached":   true,
	"billing_not_active":           true,
	"enforced_spend_limit_reached": true,
	"spend_limit_reached":          true,
}

// Classify reports what kind of failure err is and whether to retry it. now is used to turn
// an HTTP-date Retry-After into a wait when the response has no Date (see ParseRetryAfter). A nil err is ClassOK. Classify is pure and safe for
// concurrent use; the rules and their order are in the package documentation.
func Classify(err error, now time.Time) Decision {
	if err == nil {
		return Decision{Class: ClassOK}
	}
	if errors.Is(err, context.Canceled) {
		return Decision{Class: ClassCanceled}
	}

	var d Decision
	if s, ok := errors.AsType[httpStatuser](err); ok {
		d.StatusCode = s.HTTPStatus()
	}
	var header http.Header
	if rh, ok := errors.AsType[responseHeaderer](err); ok {
		header = rh.ResponseHeader()
		d.RetryAfter, d.HasRetryAfter = ParseRetryAfter(header, now)
		if !d.HasRetryAfter {
			d.RetryAfterValue, d.MalformedRetryAfter = malformedRetryAfter(header)
		}
	}

	if tl, ok := errors.AsType[tooLarger](err); ok {
		d.TooLarge = tl.TooLarge() // kept by with for a permanent class only
	}
	if et, ok := errors.AsType[errorTyper](err); ok && spendCapCodes[strings.ToLower(strings.TrimSpace(et.ErrorType()))] {
		return d.with(ClassSpendCap)
	}
	if d.TooLarge && d.StatusCode == http.StatusTooManyRequests {
		// OpenAI's refusal of a request larger than the whole tokens-per-minute limit: no wait
		// heals it, whatever its rate-limit headers say.
		return d.with(ClassPermanent)
	}
	if retry, ok := shouldRetry(header); ok {
		if !retry {
			return d.with(ClassPermanent)
		}
		if c := statusClass(d.StatusCode, d.HasRetryAfter, d.MalformedRetryAfter); c == ClassRateLimited {
			return d.with(c)
		}
		return d.with(ClassRetryable)
	}
	if d.StatusCode > 0 {
		return d.with(statusClass(d.StatusCode, d.HasRetryAfter, d.MalformedRetryAfter))
	}

	if errors.Is(err, context.DeadlineExceeded) {
		return d.with(ClassTimeout)
	}
	if t, ok := errors.AsType[timeouter](err); ok {
		if t.Timeout() {
			return d.with(ClassTimeout)
		}
		return d.with(ClassNetwork)
	}
	return d.with(ClassInternal)
}

// with sets the class and the fields that follow from it. TooLarge stays only on a permanent
// class: a refusal the provider asks us to retry (x-should-retry: true) is retried where it is.
func (d Decision) with(c Class) Decision {
	d.Class = c
	d.TooLarge = d.TooLarge && c == ClassPermanent
	switch c {
	case ClassRetryable, ClassRateLimited, ClassTimeout, ClassNetwork:
		d.Retry = true
	case ClassSpendCap:
		d.DeadReason = DeadReasonRateLimitedNoRetryAfter
	}
	return d
}

// statusClass is the status table. A 429 is rate_limited with a usable hint, retryable with a
// malformed one (the server asks for a retry, just not when), and a spend cap without any.
func statusClass(status int, hasRetryAfter, malformedRetryAfter bool) Class {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusInternalServerError,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout,
		529: // Anthropic "overloaded"
		return ClassRetryable
	case http.StatusTooManyRequests:
		switch {
		case hasRetryAfter:
			return ClassRateLimited
		case malformedRetryAfter:
			return ClassRetryable
		}
		return ClassSpendCap
	default:
		return ClassPermanent
	}
}

// shouldRetry reads the x-should-retry header that Anthropic and OpenAI send to tell their
// SDKs what to do. Values other than true/false are ignored.
func shouldRetry(h http.Header) (retry, ok bool) {
	v, ok := headerValue(h, "X-Should-Retry")
	if !ok {
		return false, false
	}
	switch strings.ToLower(v) {
	case "true":
		return true, true
	case "false":
		return false, true
	default:
		return false, false
	}
}
