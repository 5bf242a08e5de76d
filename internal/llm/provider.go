package llm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/jsonscan"
	"github.com/llmq/llmq/internal/streamname"
)

// DefaultMaxResponseBytes is the default cap on a successful response body: far above any
// real completion, low enough that a misbehaving server cannot exhaust a worker's memory.
const DefaultMaxResponseBytes = 32 << 20

// maxErrorBodyBytes caps how much of a non-2xx body is read: enough for any provider error
// JSON; the rest is discarded.
const maxErrorBodyBytes = 64 << 10

// Config configures a Provider.
type Config struct {
	// Kind selects the API dialect. Required.
	Kind Kind
	// BaseURL is the provider's absolute http(s) URL without the API path, e.g.
	// https://api.anthropic.com or http://127.0.0.1:8090. Send appends /v1/messages
	// (Anthropic) or /v1/chat/completions (OpenAI) to its path; a trailing "/v1" in
	// BaseURL is accepted and not doubled. It must not carry credentials, a query or a
	// fragment. Required.
	BaseURL string
	// APIKey is sent as x-api-key (Anthropic) or Authorization: Bearer (OpenAI). Empty
	// sends no credential header (the local simulator needs none). It never appears in
	// an error.
	APIKey string
	// HTTPClient sends the requests. Default: a client with a pooled transport (cloned from
	// http.DefaultTransport, 256 idle connections per host) and no overall timeout: the
	// context passed to Send bounds each call. A given client is copied and its
	// CheckRedirect replaced so that redirects are never followed: following one would
	// forward the API key to wherever the redirect points; a 3xx is returned as a
	// *StatusError instead.
	HTTPClient *http.Client
	// Now returns the current time; it timestamps latency, time to first byte and
	// OpenAI's relative reset times. Default time.Now.
	Now func() time.Time
	// MaxResponseBytes caps a 2xx body; a larger one fails with ErrResponseTooLarge.
	// Default DefaultMaxResponseBytes (32 MiB). Must not be negative, nor above the
	// AnswerBudget's largest answer.
	MaxResponseBytes int64
	// AnswerBudget, when set, bounds the bytes of answers held at once by every Provider that
	// shares it (a worker process gives all of its Providers one): a call waits for room, with
	// its context, and a Response holds its body's bytes until Release. Nil: each answer is only
	// capped by MaxResponseBytes.
	AnswerBudget *AnswerBudget
}

// Provider sends requests to one provider endpoint with one credential.
type Provider interface {
	// Kind returns the API dialect.
	Kind() Kind
	// Send posts body, the provider-native request JSON, verbatim and returns the answer.
	// One call is one HTTP request; Send never retries. ctx bounds the whole call,
	// including reading the body; cancelling it aborts the request in flight.
	//
	// A body with "stream": true is answered as an event stream: Send reads it to its end,
	// hands each delta to opts.OnDelta, and returns the message assembled in the shape a
	// non-streaming call returns (content, stop reason, usage). For OpenAI it adds
	// "stream_options":{"include_usage":true} when the body sets no stream_options, and
	// include_usage inside a stream_options that does not set it, so that the usage is known. The API key is masked in each delta's text as in the body (a key split
	// across two deltas is masked only in the assembled body).
	//
	// Errors: ErrInvalidRequest (wrapped) when body is not a JSON object, and nothing is
	// sent; *StatusError for a non-2xx answer, for a 2xx whose body is the provider's error
	// object (a top-level "error" that is a non-empty string, or an object whose type, code
	// or message is set: an empty one is an answer's), or for an error
	// event inside a stream (StatusError.MidStream); a stream cut before its end marker, and a
	// 2xx body whose JSON ends early (a close-delimited body cut cleanly), is a *TransportError;
	// *TransportError when no complete answer arrived, wrapping ctx.Err() when the context
	// ended the call (also while it waited for room in the AnswerBudget, before sending);
	// ErrDecode or ErrResponseTooLarge (wrapped) for a 2xx answer we cannot use — in that
	// case the *Response is returned too, with status, header and timings (and Body when it
	// was read), so the attempt can still be recorded. Call Release on a returned *Response
	// once its Body is no longer held.
	//
	// Safe for concurrent use.
	Send(ctx context.Context, body []byte, opts SendOptions) (*Response, error)
}

// SendOptions are per-call knobs.
type SendOptions struct {
	// FirstByteTimeout, when positive, aborts the call if no byte of the response BODY has
	// arrived this long after sending (headers alone do not count: a provider may send them
	// before it has generated anything). The error is a *TransportError whose Timeout() is true
	// and which matches ErrFirstByteTimeout. Zero: only ctx bounds the call.
	FirstByteTimeout time.Duration
	// StallTimeout, when positive, aborts the call if, once the response body has begun (its
	// first byte, streamed or not), a read of it waits this long for the next byte: an answer
	// that stalled partway. Only the time spent waiting on the provider counts, not the time
	// between reads (OnDelta, waiting for room in the AnswerBudget). The error is a
	// *TransportError whose Timeout() is true and which matches ErrStallTimeout. Zero: no timer
	// at all; only ctx (and FirstByteTimeout, before the body begins) bounds the call.
	StallTimeout time.Duration
	// OnDelta, when set, receives each piece of a streamed answer (a body with "stream": true),
	// in order, on the calling goroutine, as it is read: it must not block for long, the
	// provider's stream waits for it. It is never called for a non-streaming answer. The key is
	// masked in each block's text as in the body, so a block's pieces add up to its text in the
	// body; a piece's last few characters that may start the key wait for the block's next piece
	// or its end (Anthropic content_block_stop; else the end marker: an OpenAI finish_reason
	// does not promise the choice's end), and are dropped when the stream fails.
	OnDelta func(Delta)
	// OnStream, when set, is called once for a streamed answer (a 2xx event stream answering a
	// body with "stream": true) as soon as its headers are in: before its body is read and
	// before the first OnDelta, on the calling goroutine, so it must not block for long. It is
	// what the headers say, for a caller that learns from them (a rate limit) and should not
	// wait for the end of a stream that may last minutes. It is not called for any other
	// answer, whose headers come back with Send's result.
	OnStream func(StreamStart)
}

// StreamStart is what a streamed answer's headers say (SendOptions.OnStream).
type StreamStart struct {
	// StatusCode is the HTTP status (2xx).
	StatusCode int
	// RateLimit is the request rate-limit family parsed from the headers, as Response.RateLimit.
	RateLimit RateLimit
}

// ErrFirstByteTimeout is the error when no response body byte arrived within
// SendOptions.FirstByteTimeout.
var ErrFirstByteTimeout = errors.New("no response body byte within the first-byte timeout")

// ErrStallTimeout is matched by the error of an answer whose body began, then sent no byte for
// SendOptions.StallTimeout. The error itself says for how long ("no new answer byte for 30s").
var ErrStallTimeout = errors.New("answer stalled past the stall timeout")

// stallError is the cause of a call ended by SendOptions.StallTimeout.
type stallError struct{ after time.Duration }

func (e *stallError) Error() string {
	return "no new answer byte for " + e.after.String() + " after the body began (stall timeout)"
}

// Is matches ErrStallTimeout.
func (e *stallError) Is(target error) bool { return target == ErrStallTimeout }

// Response is a 2xx answer.
type Response struct {
	// StatusCode is the HTTP status.
	StatusCode int
	// Body is the provider's JSON, verbatim except that the API key, if the provider echoed it, is
	// masked byte for byte.
	Body []byte
	// Header is the response header, the API key redacted.
	Header http.Header
	// Usage is the token usage reported in Body; zero when absent, or when it counts nothing
	// (Usage.Reported).
	Usage Usage
	// RateLimit is the request rate-limit family parsed from Header.
	RateLimit RateLimit
	// Latency is the time from sending the request to having read the whole body.
	Latency time.Duration
	// TimeToFirstByte is the time from sending the request to reading the first body byte
	// (not the headers: a provider may send headers long before it has generated
	// anything). It equals Latency for an empty body.
	TimeToFirstByte time.Duration

	// hold is the room Body takes in the Provider's AnswerBudget, until Release.
	hold *answerHold
}

// Release gives the bytes of Body back to the AnswerBudget of the Provider that read it, if any:
// call it once the body is no longer held (stored, or dropped), or other calls of the process may
// wait for the room for ever. Body stays valid: the budget counts bytes, it reuses none. It is a
// no-op on a nil Response and after the first call; it is not safe for concurrent use.
func (r *Response) Release() {
	if r != nil {
		r.hold.release()
		r.hold = nil
	}
}

// Usage is token usage, normalised: OpenAI prompt_tokens and completion_tokens map to
// InputTokens and OutputTokens.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	// CacheCreationInputTokens and CacheReadInputTokens are Anthropic's prompt-caching counts
	// (cache_creation_input_tokens, cache_read_input_tokens): input written to the cache and read
	// from it, besides InputTokens (the input after the last cache breakpoint). Zero for OpenAI,
	// whose prompt_tokens include its cached tokens.
	CacheCreationInputTokens int `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens,omitempty"`
	// OutputUnreported is true when a usage reporting other counts reported no output count at
	// all (a gateway's partial usage; an Anthropic stream whose output was never reported after
	// message_start's placeholder), as against one reporting 0 output tokens (an empty answer):
	// OutputTokens is 0 then, but what the provider counted is unknown. Encoded only when true
	// (output_unreported), so that a stored usage tells the two apart.
	OutputUnreported bool `json:"output_unreported,omitempty"`
}

// withOutput is u with its output count output, the count parsed: nil when the usage object
// had none (OutputUnreported, unless u reports nothing else either: no usage at all). Whatever
// OutputUnreported u had is replaced: a provider's usage decoded into a Usage may hold our
// output_unreported key, which is no provider's.
func (u Usage) withOutput(output *int) Usage {
	u.OutputUnreported = false
	if output != nil {
		u.OutputTokens = *output
		return u
	}
	u.OutputTokens = 0
	u.OutputUnreported = u != (Usage{})
	return u
}

// Reported reports whether u counts anything: false for an answer without a usage (no member,
// null, {}) and for one whose counts are all 0 or absent, which is no count (every prompt is at
// least a token; some gateways send a zeroed usage in every answer). A usage not reported is
// stored as none (NULL: the job's JSON reads "usage": null, an attempt's has no usage) and
// settles nothing: the reservation stays charged as estimated.
func (u Usage) Reported() bool { return u != Usage{} }

// LimitedInput is the input the provider's input-token rate limit counts: InputTokens and
// CacheCreationInputTokens. Cache reads do not count toward Anthropic's input-tokens-per-minute
// limit (current models; see docs/decisions.md, "Prompt caching").
func (u Usage) LimitedInput() int { return u.InputTokens + u.CacheCreationInputTokens }

// PromptInput is the whole prompt the provider read, cached or not: InputTokens,
// CacheCreationInputTokens and CacheReadInputTokens. A count of the request's text estimates it.
func (u Usage) PromptInput() int {
	return u.InputTokens + u.CacheCreationInputTokens + u.CacheReadInputTokens
}

// dialect is what differs between providers.
type dialect interface {
	kind() Kind
	// path is the API path appended to the base URL.
	path() string
	// setHeaders adds the credential and version headers.
	setHeaders(h http.Header, apiKey string)
	// rateLimit parses the request rate-limit family; received is when headers arrived.
	rateLimit(h http.Header, received time.Time) RateLimit
	// usage parses the usage object of a successful body; best effort.
	usage(raw json.RawMessage) Usage
	// assembler reads one event stream.
	assembler() assembler
}

type client struct {
	d        dialect
	url      string
	apiKey   string
	red      redactor
	http     *http.Client
	now      func() time.Time
	maxBytes int64
	budget   *AnswerBudget
}

var _ Provider = (*client)(nil)

// New returns a Provider for cfg. It returns an error naming the field when Kind is
// unknown, BaseURL is not an absolute http(s) URL (or carries credentials, a query or a
// fragment), or MaxResponseBytes is negative. The Provider is safe for concurrent use.
func New(cfg Config) (Provider, error) {
	var d dialect
	switch cfg.Kind {
	case KindAnthropic:
		d = anthropic{}
	case KindOpenAI:
		d = openAI{}
	default:
		return nil, fmt.Errorf("llm: Kind: unknown provider kind %q (want %q or %q)", cfg.Kind, KindAnthropic, KindOpenAI)
	}
	endpoint, err := endpointURL(cfg.BaseURL, d.path())
	if err != nil {
		return nil, fmt.Errorf("llm: BaseURL: %w", err)
	}
	if cfg.MaxResponseBytes < 0 {
		return nil, fmt.Errorf("llm: MaxResponseBytes must not be negative, got %d", cfg.MaxResponseBytes)
	}
	if b := cfg.AnswerBudget; b != nil && cmp.Or(cfg.MaxResponseBytes, DefaultMaxResponseBytes) > b.reserve {
		return nil, fmt.Errorf("llm: MaxResponseBytes (%d) is above the AnswerBudget's largest answer (%d)",
			cmp.Or(cfg.MaxResponseBytes, DefaultMaxResponseBytes), b.reserve)
	}
	c := &client{
		d:        d,
		url:      endpoint,
		apiKey:   cfg.APIKey,
		red:      newRedactor(cfg.APIKey),
		now:      cfg.Now,
		maxBytes: cfg.MaxResponseBytes,
		budget:   cfg.AnswerBudget,
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.maxBytes == 0 {
		c.maxBytes = DefaultMaxResponseBytes
	}
	if cfg.HTTPClient != nil {
		hc := *cfg.HTTPClient
		hc.CheckRedirect = refuseRedirect
		c.http = &hc
	} else {
		c.http = defaultHTTPClient()
	}
	return c, nil
}

func endpointURL(base, apiPath string) (string, error) {
	if strings.TrimSpace(base) == "" {
		return "", errors.New("must be set")
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parse %q: %w", base, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%q is not an absolute http(s) URL", base)
	case u.Host == "":
		return "", fmt.Errorf("%q has no host", base)
	case u.User != nil:
		return "", errors.New("must not contain credentials; use APIKey")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", fmt.Errorf("%q must not have a query or fragment", u.Redacted())
	}
	p := strings.TrimRight(u.Path, "/")
	p = strings.TrimSuffix(p, "/v1")
	u.Path = p + apiPath
	u.RawPath = ""
	return u.String(), nil
}

func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func defaultHTTPClient() *http.Client {
	var t *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		t = dt.Clone()
	} else {
		t = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	// A worker runs hundreds of concurrent calls against one host; the default of 2 idle
	// connections per host would make most calls pay a new TCP+TLS handshake.
	t.MaxIdleConns = 0
	t.MaxIdleConnsPerHost = 256
	t.IdleConnTimeout = 90 * time.Second
	return &http.Client{Transport: t, CheckRedirect: refuseRedirect}
}

// Kind returns the API dialect.
func (c *client) Kind() Kind { return c.d.kind() }

// Send implements Provider.
func (c *client) Send(ctx context.Context, body []byte, opts SendOptions) (*Response, error) {
	stream, reqTop, err := checkRequestBody(body)
	if err != nil {
		return nil, err
	}
	if stream && c.d.kind() == KindOpenAI {
		body = withStreamUsage(body, reqTop)
	}
	// Room for the answer is taken before the request goes out, so that waiting for it costs the
	// provider nothing and counts against no first-byte timeout; enough for any error body.
	hold, err := c.budget.hold(ctx, maxErrorBodyBytes)
	if err != nil {
		return nil, c.transportError(ctx, "wait for room for the answer", err)
	}
	keepHold := false
	defer func() {
		if !keepHold {
			hold.release()
		}
	}()
	var firstByte *time.Timer
	var cancel context.CancelCauseFunc
	if opts.FirstByteTimeout > 0 || opts.StallTimeout > 0 {
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
	}
	if opts.FirstByteTimeout > 0 {
		firstByte = time.AfterFunc(opts.FirstByteTimeout, func() { cancel(ErrFirstByteTimeout) })
		defer firstByte.Stop()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("llm: build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	req.Header.Set("User-Agent", "llmq")
	c.d.setHeaders(req.Header, c.apiKey)

	start := c.now()
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.transportError(ctx, "send request", err)
	}
	defer resp.Body.Close()
	if opts.StallTimeout > 0 {
		stall := newStallReader(resp.Body, opts.StallTimeout, cancel)
		defer stall.timer.Stop()
		resp.Body = stall
	}
	received := c.now()
	ok := resp.StatusCode >= 200 && resp.StatusCode < 300

	limit := int64(maxErrorBodyBytes)
	if ok {
		limit = c.maxBytes
	}
	if ok && stream && isEventStream(resp.Header) {
		rl := c.d.rateLimit(resp.Header, received)
		if opts.OnStream != nil {
			opts.OnStream(StreamStart{StatusCode: resp.StatusCode, RateLimit: rl})
		}
		out, err := c.finishStream(ctx, resp, limit, hold, firstByte, opts.OnDelta, start, rl)
		if out != nil && out.hold != nil {
			keepHold = true
		}
		return out, err
	}
	tr := &ttfbReader{r: resp.Body, now: c.now, firstByte: firstByte}
	data, cut, readErr := readBody(ctx, tr, limit, resp.ContentLength, hold)
	latency := max(c.now().Sub(start), 0) // an injected clock need not be monotonic
	ttfb := latency
	var cutTTFB time.Duration // a cut body's: the time to its first byte, when one came
	if !tr.first.IsZero() {
		ttfb = min(max(tr.first.Sub(start), 0), latency)
		cutTTFB = ttfb
	}
	rl := c.d.rateLimit(resp.Header, received)
	header := c.red.header(resp.Header)

	if !ok {
		if readErr != nil && ctx.Err() != nil {
			return nil, answeredTransportError(c.transportError(ctx, "read response body", readErr), resp.StatusCode, cutTTFB)
		}
		// Any other read failure still leaves an authoritative status: report it.
		return nil, c.statusError(resp.StatusCode, header, data, cut, rl, latency, ttfb)
	}
	if readErr != nil {
		return nil, answeredTransportError(c.transportError(ctx, "read response body", readErr), resp.StatusCode, cutTTFB)
	}
	out := &Response{
		StatusCode:      resp.StatusCode,
		Header:          header,
		RateLimit:       rl,
		Latency:         latency,
		TimeToFirstByte: ttfb,
	}
	if cut {
		return out, fmt.Errorf("llm: read response body: %w (limit %d bytes)", ErrResponseTooLarge, limit)
	}
	// The key inside a string is masked byte for byte, which keeps the JSON valid; one anywhere
	// else makes the body unusable, and the check below says so.
	c.red.maskBytes(data)
	if slack := cap(data) - len(data); slack > 4<<10 {
		// A body of unknown length was read into a doubling buffer: keep (and count) only its bytes.
		data = append(make([]byte, 0, len(data)), data...)
	}
	if !startsObject(data) {
		out.Body = data
		hold.settle(int64(cap(data)))
		out.hold, keepHold = hold, true
		return out, c.decodeError(resp.StatusCode, header, data)
	}
	usage, errRaw, err := answerMembers(data) // checks the whole answer is valid JSON
	if err != nil {
		if closeDelimited(resp) && cutShort(data) {
			// A body framed by the connection's end ends cleanly when the server dies mid-write:
			// only the JSON shows the cut, and it is the transport's failure, as a short read is.
			// A body whose length or last chunk was sent ended where the server said.
			return nil, answeredTransportError(c.transportError(ctx, "read response body", io.ErrUnexpectedEOF), resp.StatusCode, cutTTFB)
		}
		out.Body = data
		hold.settle(int64(cap(data)))
		out.hold, keepHold = hold, true
		return out, c.decodeError(resp.StatusCode, header, data)
	}
	if typ, code, msg, isErr := errorInAnswer(errRaw); isErr {
		// The provider's error object under a 2xx: an error, as a mid-stream error event is.
		return nil, c.answerError(typ, code, msg, header, rl, latency, ttfb)
	}
	out.Body = data
	hold.settle(int64(cap(data)))
	out.hold, keepHold = hold, true
	out.Usage = c.d.usage(usage)
	return out, nil
}

// decodeError is the error of a 2xx answer that is not a JSON object.
func (c *client) decodeError(status int, header http.Header, data []byte) error {
	return fmt.Errorf("llm: decode %d response (%d bytes, content-type %q): %w",
		status, len(data), c.red.clean(header.Get("Content-Type"), maxHeaderTextLen), ErrDecode)
}

// closeDelimited reports whether resp's body is framed by the connection's close alone (HTTP/1,
// neither a Content-Length nor chunked): its end proves nothing about its completeness.
func closeDelimited(resp *http.Response) bool {
	return resp.ProtoMajor == 1 && resp.ContentLength < 0 && len(resp.TransferEncoding) == 0
}

// cutShort reports whether data, a body json.Unmarshal refused, ends before its JSON value does:
// a body cut short, not one that is malformed. A decoder tells the two apart (io.ErrUnexpectedEOF
// against a syntax error); a syntax error's offset does not, for a malformed body whose last byte
// is the fault ({"a":1,}) has it at the end too. Run only on a refused close-delimited body.
func cutShort(data []byte) bool {
	return errors.Is(json.NewDecoder(bytes.NewReader(data)).Decode(new(json.RawMessage)), io.ErrUnexpectedEOF)
}

// errorInAnswer reports whether raw, a 2xx answer's top-level "error", holds an error, with its
// type, code and message: a non-empty string (a gateway's {"error":"text"}), or an object with a
// non-empty type, code or message. Absent, null, false, "", {} and an object whose fields are all
// empty or null are no error: some OpenAI-compatible servers put such an "error" in every answer
// (a serialized empty struct), and failing it would retry, and pay for, answers already given.
// raw is parsed again only when it is an object or a string.
func errorInAnswer(raw json.RawMessage) (typ, code, msg string, isErr bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || (raw[0] != '{' && raw[0] != '"') {
		return "", "", "", false
	}
	typ, code, msg, _ = parseErrorBody(append(append([]byte(`{"error":`), raw...), '}'))
	return typ, code, msg, typ != "" || code != "" || msg != ""
}

// answeredTransportError is err, a *TransportError of a body (not streamed) whose headers came,
// with their status (TransportError.StatusCode) and ttfb, the time to the body's first byte (0
// when none came: TransportError.TimeToFirstByte).
func answeredTransportError(err error, status int, ttfb time.Duration) error {
	var te *TransportError
	if errors.As(err, &te) {
		te.StatusCode, te.TimeToFirstByte = status, ttfb
	}
	return err
}

// transportError builds a *TransportError, preferring the context's error so that
// errors.Is(err, context.Canceled/DeadlineExceeded) holds whatever the transport said.
func (c *client) transportError(ctx context.Context, op string, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrFirstByteTimeout) || errors.Is(cause, ErrStallTimeout) {
		return &TransportError{Op: op, Err: cause}
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return &TransportError{Op: op, Err: ctxErr}
	}
	// net/http quotes what a broken server sent ("malformed HTTP response ..."): untrusted text.
	if msg, clean := err.Error(), c.red.clean(err.Error(), maxMessageLen); clean != msg {
		err = &redactedError{msg: clean, err: err}
	}
	return &TransportError{Op: op, Err: err}
}

// statusError builds the *StatusError of a non-2xx answer. header is already redacted; data is
// the body read, cut when the body was longer. Every text is cleaned (control characters, the
// key) before it is cut.
func (c *client) statusError(status int, header http.Header, data []byte, cut bool, rl RateLimit, latency, ttfb time.Duration) *StatusError {
	typ, code, msg, parsed := parseErrorBody(data)
	if parsed {
		msg = c.red.clean(msg, maxMessageLen)
	} else {
		msg = c.red.excerpt(data, cut)
	}
	typ, code = c.red.clean(typ, maxHeaderTextLen), c.red.clean(code, maxHeaderTextLen)
	if msg == "" && typ == "" && code == "" {
		msg = http.StatusText(status)
	}
	return &StatusError{
		StatusCode:      status,
		Type:            typ,
		Code:            code,
		Message:         msg,
		Header:          header,
		RateLimit:       rl,
		Latency:         latency,
		TimeToFirstByte: ttfb,
	}
}

// checkRequestBody refuses what we must not send, anything but a JSON object, and reports
// whether the body asks for a stream (its top-level member "stream", the last when named twice,
// is true), with the body's members when it may (top is nil when no member can be named
// "stream", see streamname: the object is only validated then, its members not copied).
func checkRequestBody(body []byte) (stream bool, top map[string]json.RawMessage, err error) {
	if !streamname.Possible(body) {
		if !isJSONObject(body) {
			return false, nil, fmt.Errorf("%w: body is not a JSON object", ErrInvalidRequest)
		}
		return false, nil, nil
	}
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return false, nil, fmt.Errorf("%w: body is not a JSON object", ErrInvalidRequest)
	}
	if raw, ok := top["stream"]; ok {
		_ = json.Unmarshal(raw, &stream) // anything but true is not a stream; the provider judges it
	}
	return stream, top, nil
}

// isJSONObject reports whether data is a valid JSON object, white space around it allowed
// (jsonscan.Valid: json.Valid's answer for less of its scanner's instructions, issue 23).
func isJSONObject(data []byte) bool { return startsObject(data) && jsonscan.Valid(data) }

// startsObject reports whether data's first byte after white space opens a JSON object: an HTML
// page or a run of white space is refused without a parse.
func startsObject(data []byte) bool {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	return len(trimmed) > 0 && trimmed[0] == '{'
}

// parseErrorBody reads either provider's error JSON, and the common variants of
// OpenAI-compatible servers ({"error":"text"}, {"message":"text"}, {"detail":"text"}).
func parseErrorBody(data []byte) (typ, code, msg string, ok bool) {
	var top map[string]json.RawMessage
	if !startsObject(data) || json.Unmarshal(data, &top) != nil || top == nil {
		return "", "", "", false
	}
	if raw, found := top["error"]; found {
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) == nil && obj != nil {
			typ, code, msg = jsonText(obj["type"]), jsonText(obj["code"]), jsonText(obj["message"])
			if code == "" {
				var details map[string]json.RawMessage
				if json.Unmarshal(obj["details"], &details) == nil {
					code = jsonText(details["error_code"])
				}
			}
			return typ, code, msg, true
		}
		if s := jsonText(raw); s != "" {
			return "", "", s, true
		}
	}
	for _, k := range []string{"message", "detail"} {
		if s := jsonText(top[k]); s != "" {
			return "", "", s, true
		}
	}
	return "", "", "", false
}

// jsonText returns a JSON string's value or a number's text; "" for anything else.
func jsonText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var n json.Number
		if json.Unmarshal(raw, &n) == nil {
			return n.String()
		}
	}
	return ""
}

// ttfbReader records when the first body byte was read, and stops the first-byte timer then.
type ttfbReader struct {
	r         io.Reader
	now       func() time.Time
	first     time.Time
	firstByte *time.Timer
}

func (t *ttfbReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 && t.first.IsZero() {
		t.first = t.now()
		if t.firstByte != nil {
			t.firstByte.Stop()
		}
	}
	return n, err
}

// stallReader ends the call (cancel, with a *stallError) when a read of a body that has begun
// waits longer than after for its next byte. The timer runs only while a read waits on the
// body: the time the caller spends between reads (emitting deltas, waiting for room in the
// answer budget) is not the provider's stall. Each read after the first byte resets the timer
// once and stops it once, and allocates nothing.
type stallReader struct {
	r     io.ReadCloser
	after time.Duration
	timer *time.Timer
	begun bool // a byte has come: the first-byte timeout, not this one, bounds the wait before
}

// newStallReader returns r's stallReader, its timer created stopped.
func newStallReader(r io.ReadCloser, after time.Duration, cancel context.CancelCauseFunc) *stallReader {
	cause := &stallError{after: after}
	t := time.AfterFunc(after, func() { cancel(cause) })
	t.Stop()
	return &stallReader{r: r, after: after, timer: t}
}

func (s *stallReader) Read(p []byte) (int, error) {
	if !s.begun {
		n, err := s.r.Read(p)
		s.begun = n > 0
		return n, err
	}
	s.timer.Reset(s.after)
	n, err := s.r.Read(p)
	s.timer.Stop()
	return n, err
}

// Close closes the body.
func (s *stallReader) Close() error { return s.r.Close() }

// redactedError hides the API key in a transport error's text while keeping the chain.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
