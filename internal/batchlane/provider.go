package batchlane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// Request is one job in a provider batch: its custom_id (the job ID) and its provider-native
// body, sent as the client submitted it.
type Request struct {
	CustomID string
	Body     json.RawMessage
}

// Kind is a result's outcome, in the providers' words.
type Kind string

// The outcomes of one request in an ended batch.
const (
	Succeeded Kind = "succeeded"
	Errored   Kind = "errored"
	Expired   Kind = "expired"
	Canceled  Kind = "canceled"
	// Failed: the batch failed as a whole (State.Failed), none of its requests run.
	Failed Kind = "failed"
)

// Result is one request's outcome in an ended batch.
type Result struct {
	CustomID string
	Kind     Kind
	// Body is the provider-native answer (Succeeded) or error body (Errored).
	Body json.RawMessage
	// Status is the HTTP status the request's error stands for (Errored); ErrorType and Message
	// describe it.
	Status    int
	ErrorType string
	Message   string

	// missing: the batch's results hold no line for the job (noLine), which the provider may
	// have run (an undecodable line), unlike an Expired line's request.
	missing bool
}

// State is a provider batch's state as polled.
type State struct {
	// Provider is the provider's own word (in_progress, ended, completed, expired, ...).
	Provider string
	// Ended: the results are final and can be read.
	Ended bool
	// Failed: the batch ended without running any request (OpenAI's failed: its input refused,
	// or a batch quota such as the enqueued token limit), and has no results; ErrorType and
	// Message are the provider's reason, cleaned.
	Failed             bool
	ErrorType, Message string
	// Files are the ids of the files an ended batch keeps at the provider (OpenAI's input,
	// output and error files; Anthropic's batches have none), recorded with its close and
	// deleted (DeleteFiles) after it: read by the poll that found it ended, not again.
	Files []string
}

// Client is one provider's batch API for one credential. Implementations are safe for
// concurrent use; every call is one or a few HTTP round trips bounded by ctx.
type Client interface {
	// Submit creates a batch of reqs tagged with ref (llmq's batch id, where the provider keeps
	// metadata) and returns the provider's batch id. Where the batch reads an uploaded file
	// (OpenAI's input file), uploaded is called with the file's id once the upload is answered,
	// before the batch is created: an error of it ends the send with that error (the file
	// deleted, best effort). Anthropic uploads nothing and never calls it.
	Submit(ctx context.Context, ref string, reqs []Request, uploaded func(fileID string) error) (string, error)
	// Find returns the id of the batch an earlier Submit of ref may have created at or after
	// since with n requests (that send's start and size: a batch's sends hold fewer requests
	// as its jobs leave it), or "" when the provider has none: the crash-window lookup. A batch
	// whose id taken reports true is another of llmq's batches, and is never the one.
	Find(ctx context.Context, ref string, since time.Time, n int, taken func(id string) bool) (string, error)
	// Poll returns the batch's state.
	Poll(ctx context.Context, id string) (State, error)
	// Results returns the ended batch's results, one per request.
	Results(ctx context.Context, id string) ([]Result, error)
	// Cancel asks the provider to stop the batch (requests not yet processed end canceled).
	Cancel(ctx context.Context, id string) error
	// DeleteFiles deletes files, an ended batch's State.Files, at the provider (one already
	// gone is no error): OpenAI's input, output and error files, which count against the
	// organisation's storage. The batch's results cannot be read after: it is called once they
	// are recorded (the batch closed), or for an upload no batch reads. The error joins those of
	// the deletes that failed, each tried once.
	DeleteFiles(ctx context.Context, files []string) error
	// Uploads lists the input files llmq uploaded at the provider that it still holds (OpenAI's
	// files of purpose batch whose name Submit gave them), each with the batch ref its name
	// carries, for the leader's pass to record those whose record was lost (see
	// Batcher.adoptUploads). Anthropic's batches have no file: none.
	Uploads(ctx context.Context) ([]Upload, error)
}

// Upload is an input file Submit uploaded (see Client.Uploads): its id at the provider, and the
// batch ref (llmq's batch id) its name carries.
type Upload struct {
	ID, Ref string
}

// NewClient returns the batch client of a credential of provider kind "anthropic" or "openai".
// hc (nil: one with a 5-minute timeout) is copied with its CheckRedirect replaced so that
// redirects are never followed: following one would send the key wherever it points (Go drops
// Authorization on a redirect to another host, not x-api-key). A 3xx is a *StatusError.
func NewClient(kind, baseURL, apiKey string, hc *http.Client) (Client, error) {
	if hc == nil {
		hc = &http.Client{Timeout: 5 * time.Minute}
	}
	copied := *hc
	copied.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	hc = &copied
	h := httpClient{base: baseURL, key: apiKey, hc: hc, kind: kind, red: llm.NewRedactor(apiKey), maxAnswer: maxAnswerLen}
	switch kind {
	case "anthropic":
		return &anthropicClient{h}, nil
	case "openai":
		return &openAIClient{h}, nil
	}
	return nil, fmt.Errorf("batch client: unknown provider %q", kind)
}

// StatusError is a batch API call the provider answered with an error status. It answers
// HTTPStatus, ResponseHeader and ErrorType, so that retrypolicy.Classify reads it as the online
// lane reads an answer (a 429 without Retry-After, or a spend-cap code, is a spend cap).
type StatusError struct {
	Status int
	// Body is the start of the answer made safe (llm.Redactor.Clean): the API key redacted,
	// control characters and invalid UTF-8 replaced, at most maxErrorBodyLen bytes.
	Body string
	// Header is the answer's header (Retry-After, x-should-retry).
	Header http.Header

	// errorType, when typed, is ErrorType read from the whole answer (cleaned), not from Body:
	// a reason after the 512th byte (a long message first) would be lost in the cut.
	errorType string
	typed     bool
}

// maxErrorBodyLen caps a StatusError's Body; maxErrorTypeLen and maxErrorMessageLen a result's
// ErrorType and Message (the online lane's caps, internal/llm).
const (
	maxErrorBodyLen    = 512
	maxErrorTypeLen    = 128
	maxErrorMessageLen = 512
	// maxErrorTypeBodyLen is the longest error answer whose reason is read from the whole of it
	// (a longer one's from Body): the online lane reads 64 KiB of an error answer. No more of an
	// error answer is read.
	maxErrorTypeBodyLen = 64 << 10
	// maxAnswerLen caps the read of a 2xx answer (a results file can be large).
	maxAnswerLen = 1 << 30
)

func (e *StatusError) Error() string {
	return fmt.Sprintf("provider answered %d: %s", e.Status, e.Body)
}

// HTTPStatus returns the answer's status.
func (e *StatusError) HTTPStatus() int { return e.Status }

// ResponseHeader returns the answer's header.
func (e *StatusError) ResponseHeader() http.Header { return e.Header }

// ErrorType returns the most specific machine-readable reason of the answer's body, in either
// provider's form: OpenAI error.code, else error.type ({"error":{"type","code"}}); Anthropic
// error.details.error_code, else error.type. "" when the body says none.
func (e *StatusError) ErrorType() string {
	if e.typed {
		return e.errorType
	}
	return errorTypeOf([]byte(e.Body))
}

// errorTypeOf is ErrorType's reading of an error answer's body.
func errorTypeOf(data []byte) string {
	var body struct {
		Error struct {
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
			Details struct {
				ErrorCode string `json:"error_code"`
			} `json:"details"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &body) != nil {
		return ""
	}
	var code string
	if json.Unmarshal(body.Error.Code, &code) == nil && code != "" {
		return code
	}
	if body.Error.Details.ErrorCode != "" {
		return body.Error.Details.ErrorCode
	}
	return body.Error.Type
}

// httpClient does the round trips of both providers.
type httpClient struct {
	base, key, kind string
	hc              *http.Client
	// red removes the key from what the provider answers, which is untrusted as the online
	// lane's answers are: providers and proxies echo the key (a 401's message, an answer).
	red llm.Redactor
	// maxAnswer caps the read of a 2xx answer: maxAnswerLen (tests set less).
	maxAnswer int64
}

// do sends one request and returns the body of a 2xx answer, the key masked in it byte for byte
// (so that its JSON stays valid), or a *StatusError whose Body is cleaned.
func (c httpClient) do(ctx context.Context, method, path, contentType string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("batch api %s %s: %w", method, path, err)
	}
	if body == nil {
		req.Body = http.NoBody
	}
	if contentType != "" {
		req.Header.Set("content-type", contentType)
	}
	if c.kind == "anthropic" {
		req.Header.Set("x-api-key", c.key)
		req.Header.Set("anthropic-version", "2023-06-01")
	} else {
		req.Header.Set("authorization", "Bearer "+c.key)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("batch api %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	// An error answer is read as far as its reason is read (maxErrorTypeBodyLen), as the online
	// lane reads one: a longer one, or one that never ends, holds neither memory nor the call.
	limit := c.maxAnswer
	if resp.StatusCode/100 != 2 {
		limit = maxErrorTypeBodyLen + 1
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, fmt.Errorf("batch api %s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		// The whole body is cleaned before it is cut: a key straddling the cut would otherwise
		// survive in part.
		se := &StatusError{Status: resp.StatusCode, Body: c.red.Clean(string(data), maxErrorBodyLen), Header: resp.Header}
		if len(data) <= maxErrorTypeBodyLen { // as much as the online lane reads of an error
			se.errorType, se.typed = c.red.Clean(errorTypeOf(data), maxErrorTypeLen), true
		}
		return nil, se
	}
	c.red.Mask(data)
	return data, nil
}

// cleanError makes a result's error type and message, provider text decoded from JSON (where
// the key may have been escaped past the byte mask), fit to store and show.
func (c httpClient) cleanError(r *Result) {
	r.ErrorType, r.Message = c.red.Clean(r.ErrorType, maxErrorTypeLen), c.red.Clean(r.Message, maxErrorMessageLen)
}

// encodeJSON is v in JSON as json.Marshal writes it, but with <, > and & as they are: a
// request's body goes into its batch no longer than stored (json.Marshal escapes them in a
// json.RawMessage too, six bytes each), so that a batch keeps within Lane.MaxBytes.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// doJSON sends v as JSON (nil: no body; see encodeJSON) and decodes a 2xx answer into out.
func (c httpClient) doJSON(ctx context.Context, method, path string, v, out any) error {
	var body []byte
	ctype := ""
	if v != nil {
		var err error
		if body, err = encodeJSON(v); err != nil {
			return fmt.Errorf("encode batch api body: %w", err)
		}
		ctype = "application/json"
	}
	data, err := c.do(ctx, method, path, ctype, body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode batch api answer of %s %s: %w", method, path, err)
	}
	return nil
}

// errCutShort: a results body ends in the middle of a line.
var errCutShort = errors.New("the results end in the middle of a line (the download was cut short)")

// cutShort reports whether data, a JSONL results body, ends in the middle of a line: its last
// line has no newline and is not a JSON value. A close-delimited answer (no length, no
// chunking) whose connection ended early reads as a clean end of file, and read as it came its
// jobs past the cut would find no line and go round again, paid twice: such a body is
// downloaded again instead. (A cut at a line's end is not seen here.) A body as long as the
// read's cap (maxAnswer) is not: the cap cut it, as it would at every download, so it is read as
// far as the cap, its last line skipped as an undecodable one (its job goes round again).
func (c httpClient) cutShort(data []byte) bool {
	if len(data) == 0 || data[len(data)-1] == '\n' || int64(len(data)) >= c.maxAnswer {
		return false
	}
	last := data[bytes.LastIndexByte(data, '\n')+1:]
	return !json.Valid(bytes.TrimSpace(last))
}

// anthropicErrorStatus is the HTTP status an Anthropic error type stands for.
func anthropicErrorStatus(typ string) int {
	switch typ {
	case "invalid_request_error":
		return http.StatusBadRequest
	case "authentication_error":
		return http.StatusUnauthorized
	case "billing_error":
		return http.StatusPaymentRequired
	case "permission_error":
		return http.StatusForbidden
	case "not_found_error":
		return http.StatusNotFound
	case "request_too_large":
		return http.StatusRequestEntityTooLarge
	case "rate_limit_error":
		return http.StatusTooManyRequests
	case "overloaded_error":
		return 529
	case "timeout_error":
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError // api_error and anything new: the provider's side
}
