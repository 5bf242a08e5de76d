package llm

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ErrInvalidRequest is wrapped by errors for a request body we refuse to send (not a JSON
// object, or asking for a stream). Nothing reached the provider.
var ErrInvalidRequest = errors.New("llm: invalid request")

// ErrDecode is wrapped by errors for a 2xx answer whose body is not a JSON object. It is our
// problem, not a transient provider failure: retrypolicy classifies it as internal.
var ErrDecode = errors.New("llm: cannot decode provider response")

// ErrResponseTooLarge is wrapped by errors for a 2xx answer whose body exceeds
// Config.MaxResponseBytes. errors.Is(err, ErrDecode) also holds for it.
var ErrResponseTooLarge = fmt.Errorf("%w: response body too large", ErrDecode)

// maxMessageLen bounds the provider message kept in a StatusError, so that an error body
// which echoes the prompt cannot flood logs and rows.
const maxMessageLen = 512

// maxHeaderTextLen bounds the other provider strings kept in an error: the error type and code,
// the Content-Type of an answer we cannot decode.
const maxHeaderTextLen = 128

// StatusError is a non-2xx answer from the provider. Its fields are filled from the error
// body of either provider: Anthropic {"type":"error","error":{"type","message","details":
// {"error_code"}}} and OpenAI {"error":{"message","type","param","code"}}. When the body is
// not such JSON, Message is a short excerpt of it (or the status text when empty).
//
// Every field holds provider text made safe (see doc.go): the API key is redacted from Type, Code,
// Message and Header, control characters are replaced, and the texts are cut only after that.
// Error() carries neither the key nor the request.
type StatusError struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Type is the provider's error type (e.g. rate_limit_error, invalid_request_error).
	Type string
	// Code is the provider's finer error code when it sends one: OpenAI error.code (e.g.
	// insufficient_quota), Anthropic error.details.error_code (e.g.
	// enforced_spend_limit_reached).
	Code string
	// Message is the provider's message, truncated to 512 bytes; for a body that is not error
	// JSON, its first 200 bytes on one line.
	Message string
	// Header is the response header, including Retry-After, retry-after-ms and
	// x-should-retry for the classifier, with the key redacted from its names and values.
	Header http.Header
	// RateLimit is the request rate-limit family parsed from Header.
	RateLimit RateLimit
	// Latency is the time from sending the request to reading the (error) body.
	Latency time.Duration
	// TimeToFirstByte is the time from sending the request to reading the first body byte.
	TimeToFirstByte time.Duration
	// MidStream reports an error event inside a 200 event stream (Anthropic "error", OpenAI a
	// chunk {"error":...}); StatusCode is then the status the provider gives that error type
	// before a stream starts (overloaded_error 529, api_error 500, ...; see errorTypeStatus).
	// A 2xx whose whole body is an error object gets its status the same way, with MidStream
	// false.
	MidStream bool
	// Usage is, for a mid-stream error, the usage the stream reported before it (Anthropic
	// message_start's input tokens, and the output a message_delta reported, OutputUnreported
	// when none did; OpenAI's usage chunk); zero when none came, and for any other error.
	Usage Usage
}

// Error describes the status, the provider's error type and message.
func (e *StatusError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "llm: provider answered %d", e.StatusCode)
	switch {
	case e.Type != "" && e.Code != "" && e.Type != e.Code:
		fmt.Fprintf(&b, " %s/%s", e.Type, e.Code)
	case e.Code != "":
		fmt.Fprintf(&b, " %s", e.Code)
	case e.Type != "":
		fmt.Fprintf(&b, " %s", e.Type)
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	return b.String()
}

// HTTPStatus returns the HTTP status code.
func (e *StatusError) HTTPStatus() int { return e.StatusCode }

// ErrorType returns Code when set, else Type: the most specific machine-readable reason.
func (e *StatusError) ErrorType() string {
	if e.Code != "" {
		return e.Code
	}
	return e.Type
}

// ResponseHeader returns the response header.
func (e *StatusError) ResponseHeader() http.Header { return e.Header }

// TooLarge reports whether the provider refused the request as too large for it: a 413
// (Anthropic request_too_large, a compatible server's Payload Too Large), a 400 whose code or
// type is context_length_exceeded (OpenAI), Anthropic's 400 invalid_request_error whose
// message begins "prompt is too long" ("prompt is too long: N tokens > M maximum"), or OpenAI's
// 429 whose message begins "Request too large for" ("Request too large for gpt-4o in
// organization org-… on tokens per min (TPM): Limit 30000, Requested 50000. …": larger than the
// organisation's whole tokens-per-minute limit, which no wait heals), unless its numbers say the
// request fits the limit (OpenAI has sent the words for such a request: a rate limit then). The
// request is not wrong as such: a credential with another model or larger limits may take it. A
// mid-stream error is never one (the provider had accepted the request).
func (e *StatusError) TooLarge() bool {
	switch {
	case e.MidStream:
		return false
	case e.StatusCode == http.StatusRequestEntityTooLarge:
		return true
	case e.StatusCode == http.StatusTooManyRequests:
		return tooLargeForTPM(e.Message)
	case e.StatusCode != http.StatusBadRequest:
		return false
	}
	return strings.EqualFold(e.Code, contextLengthExceeded) || strings.EqualFold(e.Type, contextLengthExceeded) ||
		(e.Type == "invalid_request_error" && strings.HasPrefix(strings.ToLower(e.Message), "prompt is too long"))
}

// tpmNumbers finds the limit and the request's tokens in OpenAI's "Request too large" message.
var tpmNumbers = regexp.MustCompile(`Limit (\d+), Requested (\d+)`)

// tooLargeForTPM reports whether msg, a 429's, is OpenAI's refusal of a request larger than the
// whole tokens-per-minute limit: it begins "Request too large for", and its "Limit N, Requested
// M", when there, has M above N.
func tooLargeForTPM(msg string) bool {
	if !strings.HasPrefix(strings.ToLower(msg), "request too large for") {
		return false
	}
	m := tpmNumbers.FindStringSubmatch(msg)
	if m == nil {
		return true
	}
	limit, err1 := strconv.ParseInt(m[1], 10, 64)
	requested, err2 := strconv.ParseInt(m[2], 10, 64)
	return err1 != nil || err2 != nil || requested > limit
}

// contextLengthExceeded is OpenAI's error code for a request over the model's context window.
const contextLengthExceeded = "context_length_exceeded"

// TransportError is a call that produced no complete answer: the connection was refused or
// reset, DNS or TLS failed, the body was cut short, or the context ended the call (then
// Err is ctx.Err(), so errors.Is(err, context.Canceled) or context.DeadlineExceeded holds).
type TransportError struct {
	// Op is what we were doing: "send request" or "read response body".
	Op string
	// Err is the underlying error.
	Err error
	// Usage is, for a stream cut partway, the usage it reported before the cut (Anthropic
	// message_start's input tokens, and the output a message_delta reported, OutputUnreported
	// when none did; OpenAI's usage chunk, when it came
	// before data: [DONE]); zero when none came, and for any other failure. The provider may
	// have counted more output than it reported.
	Usage Usage
	// TimeToFirstByte is, for a stream cut partway after its first delta, the time from sending
	// the request to that delta (as a Response's); for a body not streamed that was cut after
	// its first byte (cut short, or its read ended by the context), the time to that byte: the
	// provider had begun to answer. Zero when no delta or byte came, and for any other failure.
	TimeToFirstByte time.Duration
	// StatusCode is, for an answer whose body was cut (a stream cut partway, before its first
	// delta too; a body whose read failed), the HTTP status its headers gave: the provider had
	// answered. Zero when no answer's headers came. It is not the failure's status (the
	// TransportError has none: retrypolicy classifies it as a transport failure).
	StatusCode int
}

// Error describes the operation and the underlying error.
func (e *TransportError) Error() string { return "llm: " + e.Op + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *TransportError) Unwrap() error { return e.Err }

// Timeout reports whether the call timed out: a context deadline, the first-byte timeout, the
// stall timeout or a network timeout.
func (e *TransportError) Timeout() bool {
	if errors.Is(e.Err, context.DeadlineExceeded) || errors.Is(e.Err, ErrFirstByteTimeout) || errors.Is(e.Err, ErrStallTimeout) {
		return true
	}
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// FailedUsage returns the usage a failed call's provider reported before it failed (a stream
// cut partway, or ended by an error event: StatusError.Usage, TransportError.Usage), and whether
// it reported any input: the provider's own count of the prompt it read, which the caller may
// settle its token budget with instead of an estimate.
func FailedUsage(err error) (Usage, bool) {
	var u Usage
	var se *StatusError
	var te *TransportError
	switch {
	case errors.As(err, &se):
		u = se.Usage
	case errors.As(err, &te):
		u = te.Usage
	}
	return u, u.PromptInput() > 0
}
