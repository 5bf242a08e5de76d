// Package retrypolicy decides whether a failed LLM call is worth retrying and how long to
// wait before the next attempt. It is pure: no I/O, no goroutines, no global state; the
// clock and the random source are passed in.
//
// # Finding facts in an error
//
// The package never imports the provider adapters. It finds what it needs through
// errors.As against small interfaces, so any error type that implements them is understood:
//
//	interface{ HTTPStatus() int }            // the provider's HTTP status
//	interface{ ResponseHeader() http.Header } // Retry-After, retry-after-ms, x-should-retry
//	interface{ ErrorType() string }          // the provider's error code or type
//	interface{ Timeout() bool }              // a transport error (net.Error and friends)
//	interface{ TooLarge() bool }             // the provider refused the request as too large
//
// # Precedence
//
// Classify applies the first rule that matches:
//
//  1. nil → ok.
//  2. errors.Is(err, context.Canceled) → canceled (not retried: someone asked us to stop).
//  3. ErrorType() is a spend-cap code (insufficient_quota, billing_error,
//     billing_hard_limit_reached, billing_not_active, enforced_spend_limit_reached,
//     spend_limit_reached; case-insensitive) → spend_cap, dead with reason
//     rate_limited_no_retry_after, even if the provider says x-should-retry: true. Such errors
//     keep failing until an operator acts.
//  4. A 429 whose error says TooLarge() (OpenAI's "Request too large for …": more tokens than
//     the whole tokens-per-minute limit) → permanent, with or without Retry-After or
//     x-should-retry: no wait heals it.
//  5. An x-should-retry response header overrides the status table: "true" → retried (class
//     rate_limited for a 429 with Retry-After, otherwise retryable); "false" → permanent.
//  6. The status table: 408, 409, 500, 502, 503, 504, 529 → retryable; 429 with a usable
//     Retry-After → rate_limited; 429 with a malformed one ("-5", "abc", "1s", empty, a date in
//     no RFC 9110 form) → retryable: the server wants a retry and gave no usable hint; 429
//     without the header at all → spend_cap (dead: a 429 that gives no hint is usually a spend
//     cap); any other status (400, 401, 403, 404, 413, 422, 3xx, 501, ...) → permanent. When
//     unsure, do not retry.
//  7. errors.Is(err, context.DeadlineExceeded), or Timeout() == true → timeout (retried).
//  8. Timeout() == false → network (retried): connection refused or reset, DNS, TLS, a body cut
//     short.
//  9. Anything else → internal (not retried): an error that matches none of the interfaces is
//     our own bug — a decode error, an invalid request we built — not the provider's fault.
//
// Decision.TooLarge marks a permanent decision whose error says TooLarge() (a 413, a context
// window exceeded, OpenAI's 429 for a request above the whole tokens-per-minute limit): the
// class stays permanent, and the caller may move the job to a credential with larger limits
// instead of failing it.
//
// # Delays
//
// When the server gives a hint (Retry-After, retry-after-ms) Policy.Delay waits exactly that
// plus a random spread, so that clients which got the same whole-second answer do not come
// back in the same instant, and never longer than Config.MaxRetryAfter (5 minutes by default:
// one header must not park a job for an hour). Without a usable hint it uses full jitter,
// U(0, min(MaxDelay, BaseDelay·2^(attempt-1))). See Config for the defaults and the spread
// formula.
package retrypolicy
