package retrypolicy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/retrypolicy"
)

// providerError is a test-only stand-in for a provider's status error: it has the methods
// retrypolicy looks for, and nothing else.
type providerError struct {
	status  int
	header  http.Header
	errType string
}

func (e *providerError) Error() string               { return fmt.Sprintf("status %d %s", e.status, e.errType) }
func (e *providerError) HTTPStatus() int             { return e.status }
func (e *providerError) ResponseHeader() http.Header { return e.header }
func (e *providerError) ErrorType() string           { return e.errType }

// sizeError is a providerError whose provider refused the request as too large for it.
type sizeError struct{ providerError }

func (e *sizeError) TooLarge() bool { return true }

func tooLarge(code int, kv ...string) error {
	return &sizeError{providerError{status: code, header: header(kv...)}}
}

// transportError is a test-only stand-in for a transport failure.
type transportError struct {
	timeout bool
	err     error
}

func (e *transportError) Error() string {
	return fmt.Sprintf("transport (timeout=%t): %v", e.timeout, e.err)
}
func (e *transportError) Timeout() bool { return e.timeout }
func (e *transportError) Unwrap() error { return e.err }

func status(code int, kv ...string) error {
	return &providerError{status: code, header: header(kv...)}
}

func typed(code int, errType string, kv ...string) error {
	return &providerError{status: code, header: header(kv...), errType: errType}
}

// malformed429 is the decision for a 429 whose Retry-After value v is unusable.
func malformed429(v string) retrypolicy.Decision {
	return retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 429, MalformedRetryAfter: true, RetryAfterValue: v}
}

func TestClassify(t *testing.T) {
	t.Parallel()

	const spendCap = retrypolicy.DeadReasonRateLimitedNoRetryAfter
	past := testNow.Add(-time.Minute).Format(http.TimeFormat)

	tests := []struct {
		name string
		err  error
		want retrypolicy.Decision
	}{
		{"Nil", nil, retrypolicy.Decision{Class: retrypolicy.ClassOK}},

		{"Canceled", context.Canceled, retrypolicy.Decision{Class: retrypolicy.ClassCanceled}},
		{"CanceledWrapped", fmt.Errorf("send: %w", context.Canceled), retrypolicy.Decision{Class: retrypolicy.ClassCanceled}},
		{"CanceledInsideTransportError", &transportError{err: context.Canceled}, retrypolicy.Decision{Class: retrypolicy.ClassCanceled}},

		{"400", status(400), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 400}},
		{"401", status(401), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 401}},
		{"403", status(403), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 403}},
		{"404", status(404), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 404}},
		{"413", status(413), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 413}},
		{"422", status(422), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 422}},
		{"UnknownStatus418", status(418), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 418}},
		{"UnknownStatus501", status(501), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 501}},
		{"Redirect307", status(307), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 307}},

		{"408", status(408), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 408}},
		{"409", status(409), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 409}},
		{"500", status(500), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 500}},
		{"502", status(502), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 502}},
		{"503", status(503), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 503}},
		{"504", status(504), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 504}},
		{"529", status(529), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 529}},
		{"503WithRetryAfter", status(503, "Retry-After", "5"), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 503, RetryAfter: 5 * time.Second, HasRetryAfter: true}},
		{"WrappedStatus", fmt.Errorf("attempt 3: %w", status(502)), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 502}},

		{"429RetryAfterSeconds", status(429, "Retry-After", "2"), retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: 2 * time.Second, HasRetryAfter: true}},
		{"429RetryAfterMs", status(429, "Retry-After-Ms", "1250"), retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: 1250 * time.Millisecond, HasRetryAfter: true}},
		{"429RetryAfterPastDate", status(429, "Retry-After", past), retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, HasRetryAfter: true}},
		{"429RateLimitErrorType", typed(429, "rate_limit_error", "Retry-After", "1"), retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: time.Second, HasRetryAfter: true}},
		{"429NoRetryAfter", status(429), retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 429}},
		// A malformed Retry-After still says "retry later": retryable with full jitter, never a spend cap.
		{"429MalformedRetryAfterWord", status(429, "Retry-After", "later"), malformed429("later")},
		{"429MalformedRetryAfterNegative", status(429, "Retry-After", "-5"), malformed429("-5")},
		{"429MalformedRetryAfterLetters", status(429, "Retry-After", "abc"), malformed429("abc")},
		{"429MalformedRetryAfterUnit", status(429, "Retry-After", "1s"), malformed429("1s")},
		{"429MalformedRetryAfterEmpty", status(429, "Retry-After", ""), malformed429("")},
		{"429MalformedRetryAfterBlank", status(429, "Retry-After", "  "), malformed429("  ")},
		{"429MalformedRetryAfterRFC3339Date", status(429, "Retry-After", "2026-03-01T12:00:05Z"), malformed429("2026-03-01T12:00:05Z")},
		{"429MalformedRetryAfterDateNoZone", status(429, "Retry-After", "Sun, 01 Mar 2026 12:00:05"), malformed429("Sun, 01 Mar 2026 12:00:05")},
		{"429MalformedRetryAfterMs", status(429, "Retry-After-Ms", "soon"), malformed429("soon")},
		{"429MalformedMsButUsableRetryAfter", status(429, "Retry-After-Ms", "soon", "Retry-After", "2"), retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: 2 * time.Second, HasRetryAfter: true}},
		{"429MalformedRetryAfterLowerCaseName", &providerError{status: 429, header: http.Header{"retry-after": {"x"}}}, malformed429("x")},
		{"429MalformedRetryAfterLongValueCut", status(429, "Retry-After", strings.Repeat("é", 40)), malformed429(strings.Repeat("é", 32) + "…")},
		{"503MalformedRetryAfter", status(503, "Retry-After", "abc"), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 503, MalformedRetryAfter: true, RetryAfterValue: "abc"}},
		{"429MalformedRetryAfterSpendCapCode", typed(429, "insufficient_quota", "Retry-After", "abc"), retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 429, MalformedRetryAfter: true, RetryAfterValue: "abc"}},
		{"429MalformedRetryAfterShouldRetryFalse", status(429, "X-Should-Retry", "false", "Retry-After", "abc"), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 429, MalformedRetryAfter: true, RetryAfterValue: "abc"}},

		{"InsufficientQuotaEvenWithRetryAfter", typed(429, "insufficient_quota", "Retry-After", "1"), retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 429, RetryAfter: time.Second, HasRetryAfter: true}},
		{"InsufficientQuotaUppercase", typed(429, " INSUFFICIENT_QUOTA "), retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 429}},
		{"AnthropicBillingError402", typed(402, "billing_error"), retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 402}},
		{"SpendLimitBeatsShouldRetryTrue", typed(429, "enforced_spend_limit_reached", "X-Should-Retry", "true"), retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 429}},
		{"BillingHardLimit", typed(400, "billing_hard_limit_reached"), retrypolicy.Decision{Class: retrypolicy.ClassSpendCap, DeadReason: spendCap, StatusCode: 400}},

		{"ShouldRetryTrueOn400", status(400, "X-Should-Retry", "true"), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 400}},
		{"ShouldRetryTrueOn429WithoutRetryAfter", status(429, "X-Should-Retry", "true"), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 429}},
		{"ShouldRetryTrueOn429WithRetryAfter", status(429, "X-Should-Retry", "true", "Retry-After", "3"), retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, StatusCode: 429, RetryAfter: 3 * time.Second, HasRetryAfter: true}},
		{"ShouldRetryFalseOn503", status(503, "X-Should-Retry", "false"), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 503}},
		{"ShouldRetryFalseOn429WithRetryAfter", status(429, "x-should-retry", "FALSE", "Retry-After", "3"), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 429, RetryAfter: 3 * time.Second, HasRetryAfter: true}},
		{"ShouldRetryGarbageIgnored", status(400, "X-Should-Retry", "maybe"), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 400}},

		{"TooLarge413", tooLarge(413), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 413, TooLarge: true}},
		{"TooLarge413ShouldRetryTrue", tooLarge(413, "X-Should-Retry", "true"), retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 413}},
		// OpenAI's 429 for a request above the whole tokens-per-minute limit never heals: no spend
		// cap without Retry-After, no rate limit with it, whatever x-should-retry says.
		{"TooLarge429", tooLarge(429), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 429, TooLarge: true}},
		{"TooLarge429RetryAfterShouldRetryTrue", tooLarge(429, "Retry-After", "3", "X-Should-Retry", "true"), retrypolicy.Decision{Class: retrypolicy.ClassPermanent, StatusCode: 429, RetryAfter: 3 * time.Second, HasRetryAfter: true, TooLarge: true}},

		{"DeadlineExceeded", context.DeadlineExceeded, retrypolicy.Decision{Class: retrypolicy.ClassTimeout, Retry: true}},
		{"DeadlineExceededWrapped", fmt.Errorf("send: %w", context.DeadlineExceeded), retrypolicy.Decision{Class: retrypolicy.ClassTimeout, Retry: true}},
		{"DeadlineExceededInsideNonTimeoutTransport", &transportError{err: context.DeadlineExceeded}, retrypolicy.Decision{Class: retrypolicy.ClassTimeout, Retry: true}},
		{"TransportTimeout", &transportError{timeout: true, err: io.EOF}, retrypolicy.Decision{Class: retrypolicy.ClassTimeout, Retry: true}},
		{"OSDeadline", fmt.Errorf("read: %w", os.ErrDeadlineExceeded), retrypolicy.Decision{Class: retrypolicy.ClassTimeout, Retry: true}},
		{"TransportNetwork", fmt.Errorf("send: %w", &transportError{err: io.ErrUnexpectedEOF}), retrypolicy.Decision{Class: retrypolicy.ClassNetwork, Retry: true}},
		{"RealConnRefused", &url.Error{Op: "Post", URL: "http://127.0.0.1:1", Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}}, retrypolicy.Decision{Class: retrypolicy.ClassNetwork, Retry: true}},
		{"RealDNS", &net.DNSError{Err: "no such host", Name: "nope.invalid", IsNotFound: true}, retrypolicy.Decision{Class: retrypolicy.ClassNetwork, Retry: true}},

		{"PlainError", errors.New("boom"), retrypolicy.Decision{Class: retrypolicy.ClassInternal}},
		{"DecodeError", fmt.Errorf("decode response: %w", &json.SyntaxError{Offset: 1}), retrypolicy.Decision{Class: retrypolicy.ClassInternal}},
		{"BareUnexpectedEOF", io.ErrUnexpectedEOF, retrypolicy.Decision{Class: retrypolicy.ClassInternal}},
		{"ZeroStatusNoOtherFacts", &providerError{}, retrypolicy.Decision{Class: retrypolicy.ClassInternal}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tt.want, retrypolicy.Classify(tt.err, testNow))
		})
	}
}

func TestClassify_RetryMatchesClass(t *testing.T) {
	t.Parallel()

	retried := map[retrypolicy.Class]bool{
		retrypolicy.ClassRetryable: true, retrypolicy.ClassRateLimited: true,
		retrypolicy.ClassTimeout: true, retrypolicy.ClassNetwork: true,
	}
	for code := 100; code < 600; code++ {
		for _, h := range []http.Header{nil, header("Retry-After", "1"), header("X-Should-Retry", "true"), header("X-Should-Retry", "false")} {
			d := retrypolicy.Classify(&providerError{status: code, header: h}, testNow)
			require.Equal(t, retried[d.Class], d.Retry, "status %d header %v: %+v", code, h, d)
			require.Equal(t, d.Class == retrypolicy.ClassSpendCap, d.DeadReason != "", "status %d header %v: %+v", code, h, d)
			require.Equal(t, code, d.StatusCode)
		}
	}
}
