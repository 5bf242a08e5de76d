package llmsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"unicode/utf8"
)

// replyPrefix starts every reply text.
const replyPrefix = "llmsim reply to: "

// replyQuoteRunes is how much of the last user message the reply quotes.
const replyQuoteRunes = 60

// chatRequest is what the simulator reads from either API's request body.
type chatRequest struct {
	model        string
	lastUserText string
	// textBytes is the bytes of all message text (tool results, tool calls and text documents
	// too), the system text, the tools and a structured output's schema.
	textBytes int
	// imageTokens is the input tokens of the messages' images, as their provider bills them
	// (image.go).
	imageTokens   int
	streamRequest bool
	// includeUsage is OpenAI's stream_options.include_usage: a last chunk carries the usage.
	includeUsage bool
	// toolName is the name of the request's first tool (Anthropic name, OpenAI function.name);
	// "" without tools.
	toolName string
	// maxTokens is max_completion_tokens (OpenAI) or else max_tokens; 0 when
	// absent or invalid.
	maxTokens int64
	// maxTokensErr reports an invalid max_tokens. It is an error only when
	// token limits are configured; otherwise max_tokens is ignored as before.
	maxTokensErr error
}

// parseChatRequest validates body as an Anthropic Messages or OpenAI Chat
// Completions request and extracts what the answer needs, reading field names
// exactly as the providers do (unmarshalExact). The error message is meant for
// the client.
func parseChatRequest(body []byte) (chatRequest, error) {
	var raw struct {
		Model    json.RawMessage `json:"model"`
		Messages json.RawMessage `json:"messages"`
		Stream   json.RawMessage `json:"stream"`
		Options  *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Tools  json.RawMessage `json:"tools"`
		System json.RawMessage `json:"system"`
		Format *struct {
			Schema json.RawMessage `json:"json_schema"`
		} `json:"response_format"`

		MaxTokens           json.RawMessage `json:"max_tokens"`
		MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	}
	if err := unmarshalExact(body, &raw); err != nil {
		return chatRequest{}, fmt.Errorf("request body is not a valid JSON object: %w", err)
	}
	var req chatRequest
	if isNull(raw.Model) || json.Unmarshal(raw.Model, &req.model) != nil || req.model == "" {
		return chatRequest{}, errors.New("model: Field required (a non-empty string)")
	}
	if !isNull(raw.Stream) {
		if err := json.Unmarshal(raw.Stream, &req.streamRequest); err != nil {
			return chatRequest{}, errors.New("stream: must be a boolean")
		}
	}
	req.includeUsage = raw.Options != nil && raw.Options.IncludeUsage
	req.toolName = firstToolName(raw.Tools)
	var messages []struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		ToolCalls []struct {
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if isNull(raw.Messages) || unmarshalExact(raw.Messages, &messages) != nil || len(messages) == 0 {
		return chatRequest{}, errors.New("messages: Field required (a non-empty array of messages)")
	}
	for i, m := range messages {
		if m.Role == "" {
			return chatRequest{}, fmt.Errorf("messages.%d.role: Field required", i)
		}
		text, err := contentText(m.Content)
		if err != nil {
			return chatRequest{}, fmt.Errorf("messages.%d.content: %w", i, err)
		}
		n, images, err := contentBytes(m.Content)
		if err != nil {
			return chatRequest{}, fmt.Errorf("messages.%d.content: %w", i, err)
		}
		req.textBytes += n
		req.imageTokens += images
		for _, c := range m.ToolCalls { // OpenAI: an assistant's calls are input, as it wrote them
			req.textBytes += len(c.Function.Name) + len(c.Function.Arguments)
		}
		if m.Role == "user" {
			req.lastUserText = text
		}
	}
	if !isNull(raw.System) {
		text, err := contentText(raw.System)
		if err != nil {
			return chatRequest{}, fmt.Errorf("system: %w", err)
		}
		req.textBytes += len(text)
	}
	if !isNull(raw.Tools) {
		req.textBytes += compactLen(raw.Tools) // the definitions are input too, without their layout
	}
	if raw.Format != nil && !isNull(raw.Format.Schema) {
		req.textBytes += compactLen(raw.Format.Schema) // a structured output's schema, as a tool's
	}
	req.maxTokens, req.maxTokensErr = parseMaxTokens(raw.MaxTokens, raw.MaxCompletionTokens)
	return req, nil
}

// firstToolName is the name of the first tool of a tools array, in either API's form; "" when
// there is none.
func firstToolName(raw json.RawMessage) string {
	var tools []struct {
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if isNull(raw) || unmarshalExact(raw, &tools) != nil || len(tools) == 0 {
		return ""
	}
	if tools[0].Name != "" {
		return tools[0].Name
	}
	return tools[0].Function.Name
}

// parseMaxTokens reads max_completion_tokens if present, else max_tokens:
// absent is 0, otherwise it must be a positive integer. As the providers' JSON
// Schema "integer", a number with a zero fraction or an exponent (4096.0,
// 4.096e3) is the integer it equals.
func parseMaxTokens(maxTokens, maxCompletionTokens json.RawMessage) (int64, error) {
	name, raw := "max_tokens", maxTokens
	if !isNull(maxCompletionTokens) {
		name, raw = "max_completion_tokens", maxCompletionTokens
	}
	if isNull(raw) {
		return 0, nil
	}
	var n int64
	if json.Unmarshal(raw, &n) == nil && n >= 1 {
		return n, nil
	}
	var f float64 // a JSON number only: a string does not decode
	if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || f < 1 || f > math.MaxInt32 {
		return 0, fmt.Errorf("%s: must be a positive integer", name)
	}
	return int64(f), nil
}

// contentText returns the text of a content value: a string, an array of
// blocks (the "text" of blocks of type "text", joined by newlines), or null.
func contentText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := unmarshalExact(raw, &blocks); err != nil {
		return "", errors.New("must be a string or an array of content blocks")
	}
	var b bytes.Buffer
	for _, bl := range blocks {
		if bl.Type != "text" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(bl.Text)
	}
	return b.String(), nil
}

// compactLen is the length of raw, valid JSON, without the white space between its tokens (the
// length json.Compact would give): a client's indentation is not input.
func compactLen(raw []byte) int {
	n, inString, escaped := 0, false, false
	for _, c := range raw {
		switch {
		case inString:
			inString = escaped || c != '"'
			escaped = !escaped && c == '\\'
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			continue
		case c == '"':
			inString = true
		}
		n++
	}
	return n
}

// contentBytes is the input a content value counts: a string's bytes, or, for an array of
// blocks, the text of its "text" blocks, of its "tool_result" blocks' content (contentText:
// a tool's result is input, as the providers count it), of its "tool_use" blocks' input (JSON
// without its layout) and of its "document" blocks with a text source (its data) or a content
// source (contentText), joined by newlines. images is the input tokens of its images, those of
// its tool results' and documents' content too (imageTokens).
func contentBytes(raw json.RawMessage) (n, images int, err error) {
	if isNull(raw) {
		return 0, 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return len(s), 0, nil
	}
	var blocks []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		Content  json.RawMessage `json:"content"`
		Input    json.RawMessage `json:"input"`
		Source   *blockSource    `json:"source"`
		ImageURL json.RawMessage `json:"image_url"`
	}
	if err := unmarshalExact(raw, &blocks); err != nil {
		return 0, 0, errors.New("must be a string or an array of content blocks")
	}
	pieces := 0
	for _, bl := range blocks {
		images += imageTokens(bl.Type, bl.Source, bl.ImageURL)
		var size int
		switch bl.Type {
		case "text":
			size = len(bl.Text)
		case "tool_result":
			text, err := contentText(bl.Content)
			if err != nil {
				return 0, 0, fmt.Errorf("tool_result content: %w", err)
			}
			size = len(text)
			images += contentImages(bl.Content)
		case "tool_use":
			size = compactLen(bl.Input)
		case "document":
			if bl.Source == nil {
				continue
			}
			var text string
			switch bl.Source.Type {
			case "text":
				if json.Unmarshal(bl.Source.Data, &text) != nil {
					return 0, 0, errors.New("document source data: must be a string")
				}
			case "content":
				var err error
				if text, err = contentText(bl.Source.Content); err != nil {
					return 0, 0, fmt.Errorf("document source content: %w", err)
				}
				images += contentImages(bl.Source.Content)
			default:
				continue // base64, a URL or a file: not text in the body
			}
			size = len(text)
		default:
			continue
		}
		if pieces > 0 {
			n++
		}
		n += size
		pieces++
	}
	return n, images, nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// replyText is the deterministic reply to req.
func replyText(req chatRequest) string {
	quote := req.lastUserText
	n := 0
	for i := range quote {
		if n == replyQuoteRunes {
			quote = quote[:i]
			break
		}
		n++
	}
	return replyPrefix + quote
}

// replyFiller pads replies to ReplyTokens; ASCII, so bytes are characters.
const replyFiller = " lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor."

// padReply returns text cut or padded to exactly 4n bytes, so that its
// token count is n: a cut falls on a rune boundary and the filler makes up
// the rest.
func padReply(text string, n int) string {
	size := 4 * n
	if len(text) > size {
		i := size
		for i > 0 && !utf8.RuneStart(text[i]) {
			i--
		}
		text = text[:i]
	}
	var b strings.Builder
	b.Grow(size)
	b.WriteString(text)
	for b.Len() < size {
		b.WriteString(replyFiller[:min(len(replyFiller), size-b.Len())])
	}
	return b.String()
}

// tokens is the token rule: bytes / 4, at least 1.
func tokens(bytes int) int { return max(bytes/4, 1) }

// inputTokens is the request's input tokens: its text's bytes / 4 plus its images', at least 1.
func (r chatRequest) inputTokens() int { return max(r.textBytes/4+r.imageTokens, 1) }

// strictUnmarshal decodes exactly one JSON value into v, refusing unknown
// fields and trailing data.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}
