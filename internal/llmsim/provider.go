package llmsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// errorKind distinguishes answers that share a status but not a body.
type errorKind int

const (
	kindStatus   errorKind = iota // body chosen by status alone
	kindAuth                      // 401, missing key
	kindSpendCap                  // 429 without retry-after
	kindTokens                    // 429 from a token bucket
	kindContext                   // 400, over the model's context window (Config.ContextTokens)
)

// apiError is an error answer before it is rendered in a provider's format.
type apiError struct {
	status  int
	kind    errorKind
	message string // empty: the provider's usual message for the status
}

// reply is the content of a successful answer.
type reply struct {
	id           string
	model        string
	text         string
	inputTokens  int
	outputTokens int
	maxedOut     bool // stopped at max_tokens
	created      time.Time
	// tools, when set, are the calls of the request's first tool that follow the text.
	tools []toolCall
}

// toolCall is a reply's call of a tool: input is its JSON arguments, {"reply": <the text>}.
type toolCall struct {
	id, name, input string
}

// stopReason is the reply's Anthropic stop reason (OpenAI: finishReason).
func (r reply) stopReason() string {
	switch {
	case r.maxedOut:
		return "max_tokens"
	case len(r.tools) > 0:
		return "tool_use"
	}
	return "end_turn"
}

func (r reply) finishReason() string {
	switch {
	case r.maxedOut:
		return "length"
	case len(r.tools) > 0:
		return "tool_calls"
	}
	return "stop"
}

// provider renders one API's dialect.
type provider interface {
	name() string
	apiKey(r *http.Request) string
	// checkHeaders returns a 400 message for missing required headers, or "".
	checkHeaders(r *http.Request) string
	idPrefix() string
	// toolIDPrefix starts a tool call's id.
	toolIDPrefix() string
	// overloadStatus is the status of the overload fault.
	overloadStatus() int
	// contextMessage returns the 400 message for a request of input tokens asking for maxTokens
	// (0: none given) that does not fit a context window of window tokens, or "" when it fits.
	contextMessage(input int, maxTokens int64, window int) string
	errorBody(e apiError, requestID string) []byte
	successBody(r reply) []byte
	// streamer renders a successful answer as the provider's event stream.
	streamer() streamer
	setHeaders(h http.Header, requestID string, st *bucketState, now time.Time)
	// combinedTokens reports whether the endpoint has one token bucket for
	// input and output (OpenAI) rather than one of each (Anthropic).
	combinedTokens() bool
	// setTokenHeaders writes the token rate-limit headers; nil writes none.
	setTokenHeaders(h http.Header, v *tokenView, now time.Time)
}

// anthropic speaks the Messages API.
type anthropic struct{}

func (anthropic) name() string         { return "anthropic" }
func (anthropic) idPrefix() string     { return "msg_" }
func (anthropic) toolIDPrefix() string { return "toolu_" }

func (anthropic) overloadStatus() int { return 529 }

// apiKey reads x-api-key, else Authorization: Bearer (the SDKs send the latter with an auth
// token rather than an API key; llmsim does not tell them apart).
func (anthropic) apiKey(r *http.Request) string {
	if k := r.Header.Get("x-api-key"); k != "" {
		return k
	}
	return bearer(r)
}

func (anthropic) checkHeaders(r *http.Request) string {
	if r.Header.Get("anthropic-version") == "" {
		return "anthropic-version: header is required"
	}
	return ""
}

func (anthropic) errorBody(e apiError, requestID string) []byte {
	type details struct {
		ErrorCode string `json:"error_code"`
	}
	type inner struct {
		Type    string   `json:"type"`
		Message string   `json:"message"`
		Details *details `json:"details,omitempty"`
	}
	in := inner{Type: anthropicErrorType(e.status), Message: e.message}
	switch {
	case e.kind == kindAuth:
		in.Type = "authentication_error"
		in.Message = "x-api-key header is required"
	case e.kind == kindSpendCap:
		in.Message = "You have reached your API usage limits: your organization's monthly spend limit is exhausted. " +
			"Access resumes when the limit resets or is raised (llmsim spend-cap fault)."
		in.Details = &details{ErrorCode: "enforced_spend_limit_reached"}
	case in.Message == "":
		in.Message = anthropicErrorMessage(e.status)
	}
	return mustJSON(struct {
		Type      string `json:"type"`
		Error     inner  `json:"error"`
		RequestID string `json:"request_id"`
	}{"error", in, requestID})
}

// contextMessage is Anthropic's: the window counts the prompt.
func (anthropic) contextMessage(input int, _ int64, window int) string {
	if input <= window {
		return ""
	}
	return fmt.Sprintf("prompt is too long: %d tokens > %d maximum", input, window)
}

func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusPaymentRequired:
		return "billing_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	case 529:
		return "overloaded_error"
	}
	if status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

func anthropicErrorMessage(status int) string {
	switch status {
	case http.StatusTooManyRequests:
		return "This request would exceed your account's rate limit. Please try again later."
	case 529:
		return "Overloaded"
	case http.StatusRequestEntityTooLarge:
		return "Request exceeds the maximum allowed number of bytes."
	}
	if status >= 500 {
		return "Internal server error"
	}
	return "Invalid request (llmsim injected error)"
}

func (anthropic) successBody(r reply) []byte {
	type text struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	content := []any{text{Type: "text", Text: r.text}}
	for _, t := range r.tools {
		content = append(content, map[string]any{"type": "tool_use", "id": t.id, "name": t.name,
			"input": json.RawMessage(t.input)})
	}
	return mustJSON(struct {
		ID           string  `json:"id"`
		Type         string  `json:"type"`
		Role         string  `json:"role"`
		Model        string  `json:"model"`
		Content      []any   `json:"content"`
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
		Usage        usage   `json:"usage"`
	}{
		ID: r.id, Type: "message", Role: "assistant", Model: r.model,
		Content:    content,
		StopReason: r.stopReason(),
		Usage:      usage{InputTokens: r.inputTokens, OutputTokens: r.outputTokens},
	})
}

func (anthropic) setHeaders(h http.Header, requestID string, st *bucketState, now time.Time) {
	h.Set("request-id", requestID)
	if st == nil {
		return
	}
	h.Set("anthropic-ratelimit-requests-limit", formatLimit(st.limit))
	h.Set("anthropic-ratelimit-requests-remaining", strconv.FormatInt(st.remaining, 10))
	h.Set("anthropic-ratelimit-requests-reset", now.Add(st.untilFull).UTC().Format("2006-01-02T15:04:05.000Z07:00"))
}

func (anthropic) combinedTokens() bool { return false }

// setTokenHeaders writes the input- and output-token families of the
// configured buckets, and the tokens family for their sum: limit and
// remaining added up, reset the later of the two.
func (anthropic) setTokenHeaders(h http.Header, v *tokenView, now time.Time) {
	if v == nil {
		return
	}
	var sum tokenState
	for _, f := range []struct {
		family string
		st     *tokenState
	}{{"input-tokens", v.input}, {"output-tokens", v.output}} {
		if f.st == nil {
			continue
		}
		setAnthropicTokenFamily(h, f.family, *f.st, now)
		sum.limit += f.st.limit
		sum.remaining += f.st.remaining
		sum.untilFull = max(sum.untilFull, f.st.untilFull)
	}
	setAnthropicTokenFamily(h, "tokens", sum, now)
}

func setAnthropicTokenFamily(h http.Header, family string, st tokenState, now time.Time) {
	h.Set("anthropic-ratelimit-"+family+"-limit", strconv.FormatInt(st.limit, 10))
	h.Set("anthropic-ratelimit-"+family+"-remaining", strconv.FormatInt(st.remaining, 10))
	h.Set("anthropic-ratelimit-"+family+"-reset", formatAnthropicReset(now.Add(st.untilFull)))
}

// formatAnthropicReset writes t in RFC 3339 with milliseconds, rounded up to
// the millisecond so that a client waiting for it is never early.
func formatAnthropicReset(t time.Time) string {
	if r := t.Truncate(time.Millisecond); !r.Equal(t) {
		t = r.Add(time.Millisecond)
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

// openAI speaks the Chat Completions API.
type openAI struct{}

func (openAI) name() string         { return "openai" }
func (openAI) idPrefix() string     { return "chatcmpl-" }
func (openAI) toolIDPrefix() string { return "call_" }

func (openAI) overloadStatus() int { return http.StatusServiceUnavailable }

func (openAI) apiKey(r *http.Request) string { return bearer(r) }

// bearer is the token of an Authorization: Bearer header; "" without one.
func bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
		return strings.TrimSpace(v[7:])
	}
	return ""
}

func (openAI) checkHeaders(*http.Request) string { return "" }

// contextMessage is OpenAI's: the window counts the input and max_tokens together.
func (openAI) contextMessage(input int, maxTokens int64, window int) string {
	if int64(input)+maxTokens <= int64(window) {
		return ""
	}
	return fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens "+
		"(%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
		window, int64(input)+maxTokens, input, maxTokens)
}

func (openAI) errorBody(e apiError, _ string) []byte {
	typ, code, msg := "invalid_request_error", "", e.message
	switch {
	case e.kind == kindAuth:
		msg = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
	case e.kind == kindTokens:
		typ, code = "tokens", "rate_limit_exceeded"
	case e.kind == kindContext:
		code = "context_length_exceeded"
	case e.kind == kindSpendCap:
		typ, code = "insufficient_quota", "insufficient_quota"
		msg = "You exceeded your current quota, please check your plan and billing details (llmsim spend-cap fault)."
	case e.status == http.StatusTooManyRequests:
		typ, code = "requests", "rate_limit_exceeded"
		if msg == "" {
			msg = "Rate limit reached for requests. Please try again later."
		}
	case e.status >= 500:
		typ = "server_error"
		if msg == "" && e.status == http.StatusServiceUnavailable {
			msg = "The engine is currently overloaded, please try again later."
		} else if msg == "" {
			msg = "The server had an error while processing your request. Sorry about that!"
		}
	case msg == "":
		msg = "Invalid request (llmsim injected error)"
	}
	var c *string
	if code != "" {
		c = &code
	}
	type inner struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	return mustJSON(struct {
		Error inner `json:"error"`
	}{inner{Message: msg, Type: typ, Code: c}})
}

func (openAI) successBody(r reply) []byte {
	type message struct {
		Role        string  `json:"role"`
		Content     string  `json:"content"`
		Refusal     *string `json:"refusal"`
		Annotations []any   `json:"annotations"` // [] as OpenAI's (url_citation with web search)
		ToolCalls   []any   `json:"tool_calls,omitempty"`
	}
	type choice struct {
		Index        int             `json:"index"`
		Message      message         `json:"message"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason string          `json:"finish_reason"`
	}
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	}
	return mustJSON(struct {
		ID      string   `json:"id"`
		Object  string   `json:"object"`
		Created int64    `json:"created"`
		Model   string   `json:"model"`
		Choices []choice `json:"choices"`
		Usage   usage    `json:"usage"`
	}{
		ID: r.id, Object: "chat.completion", Created: r.created.Unix(), Model: r.model,
		Choices: []choice{{
			Message: message{Role: "assistant", Content: r.text, Annotations: []any{},
				ToolCalls: openAIToolCalls(r.tools)},
			Logprobs:     json.RawMessage("null"),
			FinishReason: r.finishReason(),
		}},
		Usage: usage{
			PromptTokens:     r.inputTokens,
			CompletionTokens: r.outputTokens,
			TotalTokens:      r.inputTokens + r.outputTokens,
		},
	})
}

// openAIToolCalls renders tool calls as a message's tool_calls; nil without one.
func openAIToolCalls(tools []toolCall) []any {
	var calls []any
	for _, t := range tools {
		calls = append(calls, map[string]any{"id": t.id, "type": "function",
			"function": map[string]string{"name": t.name, "arguments": t.input}})
	}
	return calls
}

func (openAI) setHeaders(h http.Header, requestID string, st *bucketState, _ time.Time) {
	h.Set("x-request-id", requestID)
	if st == nil {
		return
	}
	h.Set("x-ratelimit-limit-requests", formatLimit(st.limit))
	h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(st.remaining, 10))
	h.Set("x-ratelimit-reset-requests", formatOpenAIDuration(st.untilFull))
}

func (openAI) combinedTokens() bool { return true }

// setTokenHeaders writes the tokens family of the combined bucket.
func (openAI) setTokenHeaders(h http.Header, v *tokenView, _ time.Time) {
	if v == nil || v.combined == nil {
		return
	}
	h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(v.combined.limit, 10))
	h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(v.combined.remaining, 10))
	h.Set("x-ratelimit-reset-tokens", formatOpenAIDuration(v.combined.untilFull))
}

// formatOpenAIDuration writes d rounded up to the millisecond in the form
// OpenAI uses ("120ms", "1.5s", "6m0s"), which is Go's duration syntax.
func formatOpenAIDuration(d time.Duration) string {
	if r := d % time.Millisecond; r != 0 {
		d += time.Millisecond - r
	}
	return d.String()
}

func formatLimit(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// retryAfterSeconds is ceil(d) in whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	secs := (d + time.Second - 1) / time.Second
	return strconv.FormatInt(max(int64(secs), 1), 10)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("llmsim: encode answer: " + err.Error()) // only fixed struct types are encoded
	}
	return b
}
