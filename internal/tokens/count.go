package tokens

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/llmq/llmq/internal/jsonscan"
)

// Provider kinds, the values of llm.Kind.
const (
	ProviderAnthropic = "anthropic"
	ProviderOpenAI    = "openai"
)

// DefaultMaxOutput is the output allowance of a request without max_tokens or
// max_completion_tokens.
const DefaultMaxOutput = 4096

// BytesPerToken is the fixed rule's divisor: input tokens = text bytes / BytesPerToken, at least 1.
const BytesPerToken = 4

// MaxChoices is the largest n (choices) an OpenAI Chat Completions request may ask for.
const MaxChoices = 128

// ErrInvalidRequest is wrapped by Count's errors: the body is not a request it can read.
var ErrInvalidRequest = errors.New("tokens: cannot read request")

// ErrInvalidChoices is Count's error for an OpenAI request whose n is not an integer from 1 to
// MaxChoices. It wraps ErrInvalidRequest.
var ErrInvalidChoices = fmt.Errorf("%w: n must be an integer from 1 to %d", ErrInvalidRequest, MaxChoices)

// Request is what the fixed rule reads from a request body.
type Request struct {
	// Model is the request's model ("" when absent).
	Model string
	// TextBytes is the bytes of its message and system text.
	TextBytes int
	// Input is the rule's input tokens: TextBytes / BytesPerToken + ImageTokens, at least 1.
	Input int
	// ImageTokens is the tokens of its images as their provider bills them (see the package
	// doc); an image whose size the body does not tell counts AnthropicMaxImageTokens or
	// OpenAIMaxImageTokens.
	ImageTokens int
	// UnknownImageTokens is the part of ImageTokens counted at the most for images whose size
	// the body does not tell (a URL or a file, an unreadable header).
	UnknownImageTokens int
	// MinInput is the least the input can be: Input without UnknownImageTokens (an image of
	// unknown size may be a small one), at least 1. A request is too large for a bucket only
	// when MinInput exceeds it (tokens.Cost.MinInputTokens): Input is what is reserved.
	MinInput int
	// Choices is OpenAI's n, the choices the answer holds (1 when absent, and for Anthropic).
	Choices int
	// MaxOutput is the output allowance of the whole answer: max_completion_tokens, else
	// max_tokens, else DefaultMaxOutput, times Choices (each choice may use the whole allowance,
	// and the answer's usage counts them all).
	MaxOutput int
	// AssumedOutput reports that the request sets no output allowance (no max_tokens, nor
	// OpenAI's max_completion_tokens): MaxOutput is DefaultMaxOutput per choice.
	AssumedOutput bool
}

// Count applies the fixed rule to body, an Anthropic Messages (provider "anthropic") or OpenAI
// Chat Completions ("openai") request. It is pure. It returns an error wrapping
// ErrInvalidRequest when body is not a JSON object, messages is not an array, a content is
// neither a string nor an array of blocks, an OpenAI message's tool_calls is not an array of
// calls whose arguments are a string, an OpenAI response_format is not an object, or max_tokens
// is not a positive integer,
// ErrInvalidChoices for an OpenAI n that is not an integer from 1 to MaxChoices, and an error for
// an unknown provider. An integral number written with a fraction or an exponent (4096.0, 4.096e3)
// is that integer, as the providers read it (their JSON Schema's "integer").
func Count(provider string, body []byte) (Request, error) {
	return count(provider, body, true)
}

// fields is the parts of a request body Count reads, each raw (a slice of the body, or a copy).
type fields struct {
	Model               json.RawMessage `json:"model"`
	Messages            []messageFields `json:"messages"`
	System              json.RawMessage `json:"system"`
	Tools               json.RawMessage `json:"tools"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	N                   json.RawMessage `json:"n"`
	ResponseFormat      json.RawMessage `json:"response_format"`
}

// messageFields is the parts of a message Count reads.
type messageFields struct {
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// count is Count; fast reads the usual body with scanBody rather than json.Unmarshal (tests
// compare the two).
func count(provider string, data []byte, fast bool) (Request, error) {
	if provider != ProviderAnthropic && provider != ProviderOpenAI {
		return Request{}, fmt.Errorf("count tokens: unknown provider %q", provider)
	}
	// One parse of the body, messages included (their contents stay raw).
	var raw fields
	if !fast || !scanBody(data, &raw) {
		var err error
		if raw, err = unmarshalFields(data); err != nil {
			return Request{}, err
		}
	}
	var r Request
	if !isNull(raw.Model) {
		r.Model = model(raw.Model)
	}
	for i, m := range raw.Messages {
		n, images, err := textBytes(m.Content, false)
		if err != nil {
			return Request{}, fmt.Errorf("%w: messages.%d.content: %w", ErrInvalidRequest, i, err)
		}
		r.TextBytes += n
		r.ImageTokens += images.all
		r.UnknownImageTokens += images.unknown
		if provider == ProviderOpenAI && !isNull(m.ToolCalls) {
			n, err := toolCallBytes(m.ToolCalls)
			if err != nil {
				return Request{}, fmt.Errorf("%w: messages.%d.tool_calls: %w", ErrInvalidRequest, i, err)
			}
			r.TextBytes += n
		}
	}
	if provider == ProviderAnthropic && !isNull(raw.System) {
		n, images, err := textBytes(raw.System, false)
		if err != nil {
			return Request{}, fmt.Errorf("%w: system: %w", ErrInvalidRequest, err)
		}
		r.TextBytes += n
		r.ImageTokens += images.all
		r.UnknownImageTokens += images.unknown
	}
	if !isNull(raw.Tools) {
		r.TextBytes += compactLen(raw.Tools) // the definitions' JSON, without its layout
	}
	if provider == ProviderOpenAI && !isNull(raw.ResponseFormat) {
		var f struct {
			Schema inputLen `json:"json_schema"` // the structured output's schema, as a tool's
		}
		if err := json.Unmarshal(raw.ResponseFormat, &f); err != nil {
			return Request{}, fmt.Errorf("%w: response_format: must be an object", ErrInvalidRequest)
		}
		r.TextBytes += int(f.Schema)
	}
	r.Input = max(r.TextBytes/BytesPerToken+r.ImageTokens, 1)
	r.MinInput = max(r.Input-r.UnknownImageTokens, 1)
	r.MaxOutput = DefaultMaxOutput
	name, v := "max_tokens", raw.MaxTokens
	if provider == ProviderOpenAI && !isNull(raw.MaxCompletionTokens) {
		name, v = "max_completion_tokens", raw.MaxCompletionTokens
	}
	r.AssumedOutput = isNull(v)
	if !isNull(v) {
		n, ok := integer(v, math.MaxInt32)
		if !ok {
			return Request{}, fmt.Errorf("%w: %s must be a positive integer", ErrInvalidRequest, name)
		}
		r.MaxOutput = n
	}
	r.Choices = 1
	if provider == ProviderOpenAI && !isNull(raw.N) {
		n, ok := integer(raw.N, MaxChoices)
		if !ok {
			return Request{}, ErrInvalidChoices
		}
		r.Choices = n
	}
	r.MaxOutput *= r.Choices // at most MaxInt32 × MaxChoices: no overflow in 64 bits
	return r, nil
}

// unmarshalFields decodes data with json.Unmarshal, count's fallback from scanBody. Its fields
// are its own: json.Unmarshal's target is moved to the heap, which count's (returned to its
// stack) then is not for the usual body.
func unmarshalFields(data []byte) (fields, error) {
	var raw fields
	if err := json.Unmarshal(data, &raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "messages" {
			return fields{}, fmt.Errorf("%w: messages is not an array of messages", ErrInvalidRequest)
		}
		return fields{}, fmt.Errorf("%w: body is not a JSON object: %w", ErrInvalidRequest, err)
	}
	return raw, nil
}

// integer reads raw, a JSON value, as an integer from 1 to limit. A number with a zero fraction
// or an exponent (4096.0, 4.096e3) is the integer it equals; a string, a fraction (1.5) or a
// number out of range is not.
func integer(raw json.RawMessage, limit int) (int, bool) {
	if n, ok := digits(raw); ok { // the common case, read without json's reflection
		return n, n >= 1 && n <= limit
	}
	var n int64
	if json.Unmarshal(raw, &n) == nil {
		return int(n), n >= 1 && n <= int64(limit)
	}
	var f float64 // a JSON number only: a string is an *UnmarshalTypeError
	if json.Unmarshal(raw, &f) != nil || f != math.Trunc(f) || f < 1 || f > float64(limit) {
		return 0, false
	}
	return int(f), true
}

// digits reads raw as a plain integer: up to 18 decimal digits, nothing else (no sign, fraction,
// exponent or white space: integer's json.Unmarshal reads those). Valid JSON has no leading zero.
func digits(raw []byte) (int, bool) {
	if len(raw) == 0 || len(raw) > 18 {
		return 0, false
	}
	n := 0
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// model reads raw, a JSON value, as the request's model: a string as json.Unmarshal decodes it
// ("" for any other value: a non-string model is only a worse label). A string without escapes
// in valid UTF-8, the usual one, is copied without json's reflection.
func model(raw []byte) string {
	if isString(raw) {
		if s := raw[1 : len(raw)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
			return string(s)
		}
	}
	var m string
	_ = json.Unmarshal(raw, &m)
	return m
}

// isString reports whether raw, a valid JSON value, is a string (without white space around it).
func isString(raw []byte) bool {
	return len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"'
}

// toolCallBytes is the byte length of an OpenAI assistant message's tool_calls: each call's
// function name and arguments (a string of JSON, as the model wrote it).
func toolCallBytes(raw json.RawMessage) (int, error) {
	var calls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &calls); err != nil {
		return 0, errors.New("must be an array of tool calls whose arguments are a string")
	}
	n := 0
	for _, c := range calls {
		n += len(c.Function.Name) + len(c.Function.Arguments)
	}
	return n, nil
}

// textBytes is the byte length of a content: a string, or the text of an array of blocks joined
// by newlines: a "text" block's text, a "tool_result" block's content (a string or an array of
// blocks whose "text" blocks count, as the API's), a "tool_use" block's input JSON without its
// white space, and a "document" block's text (a "text" source's data, or a "content" source's
// "text" blocks); base64, URL and file documents count nothing. images is the tokens of its
// images as the providers bill them (an Anthropic "image" block, anthropicImageTokens; an OpenAI
// "image_url" part, openAIImageTokens), with the part counted at the most for images of unknown
// size. inResult reads a tool_result's content or a document's:
// a tool_result in it counts nothing (the API has none there), so that a body nested deep is not
// read again at every level, and neither does an image_url part (OpenAI has no tool_result).
func textBytes(raw json.RawMessage, inResult bool) (n int, images imageTokens, err error) {
	if isNull(raw) {
		return 0, images, nil
	}
	if isString(raw) {
		return decodedLen(raw), images, nil // its length, without decoding it into a string
	}
	var blocks []struct {
		Type    string          `json:"type"`
		Text    string          `json:"text"`
		Content json.RawMessage `json:"content"`
		Input   inputLen        `json:"input"`
		Source  *struct {
			Type    string          `json:"type"`
			Data    sourceData      `json:"data"`
			Content json.RawMessage `json:"content"`
		} `json:"source"`
		ImageURL *imagePart `json:"image_url"` // a pointer: no room in the blocks of text
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return 0, images, errors.New("must be a string or an array of content blocks")
	}
	pieces := 0
	for _, b := range blocks {
		var size int
		switch b.Type {
		case "text":
			size = len(b.Text)
		case "tool_result":
			if inResult {
				continue
			}
			m, im, err := textBytes(b.Content, true)
			if err != nil {
				return 0, images, fmt.Errorf("tool_result content: %w", err)
			}
			size, images = m, images.plus(im)
		case "tool_use":
			size = int(b.Input)
		case "document":
			switch {
			case b.Source == nil:
				continue
			case b.Source.Type == "text":
				size = b.Source.Data.n
			case b.Source.Type == "content" && !inResult:
				m, im, err := textBytes(b.Source.Content, true)
				if err != nil {
					return 0, images, fmt.Errorf("document content: %w", err)
				}
				size, images = m, images.plus(im)
			default:
				continue // base64, a URL or a file: its text is not in the body
			}
		case "image":
			var s imageSize // unknown: a URL or a file, or no source
			if b.Source != nil && b.Source.Type == "base64" {
				s = b.Source.Data.size
			}
			images = images.plus(imageTokens{all: anthropicImageTokens(s)}.unknownWhen(!s.known()))
			continue
		case "image_url":
			if inResult {
				continue
			}
			var p imagePart // unknown: no image_url
			if b.ImageURL != nil {
				p = *b.ImageURL
			}
			images = images.plus(imageTokens{all: openAIImageTokens(p.url.size, p.detail)}.
				unknownWhen(p.detail != "low" && !p.url.size.known()))
			continue
		default:
			continue
		}
		if pieces > 0 {
			n++ // the newline joining pieces
		}
		n += size
		pieces++
	}
	return n, images, nil
}

// imageTokens is the tokens of a content's images (all), and the part of them counted at the
// most for images of unknown size (unknown).
type imageTokens struct{ all, unknown int }

// plus is t and u together.
func (t imageTokens) plus(u imageTokens) imageTokens {
	return imageTokens{all: t.all + u.all, unknown: t.unknown + u.unknown}
}

// unknownWhen is t, an image's tokens, counted as unknown too when the image's size is.
func (t imageTokens) unknownWhen(unknown bool) imageTokens {
	if unknown {
		t.unknown = t.all
	}
	return t
}

// inputLen is the compactLen of a JSON value, read where it lies in the body: no copy.
type inputLen int

// UnmarshalJSON implements json.Unmarshaler.
func (n *inputLen) UnmarshalJSON(raw []byte) error {
	if isNull(raw) {
		*n = 0
		return nil
	}
	*n = inputLen(compactLen(raw))
	return nil
}

// decodedLen is the byte length of raw, a valid JSON value, decoded as a string (json.Unmarshal's
// length): an escape counts the bytes it stands for (\uXXXX the UTF-8 length of its character, a
// surrogate pair 4, a lone surrogate 3: the replacement character), and so does a byte that is
// not UTF-8 (3: json.Unmarshal makes it the replacement character). Not a string: 0. No
// allocation.
func decodedLen(raw []byte) int {
	if len(raw) < 2 || raw[0] != '"' {
		return 0
	}
	s := raw[1 : len(raw)-1]
	n := 0
	for {
		i := bytes.IndexByte(s, '\\')
		if i < 0 {
			return n + utf8Len(s)
		}
		n += utf8Len(s[:i])
		if s[i+1] != 'u' {
			n++ // \n, \", \\ ...: one byte
			s = s[i+2:]
			continue
		}
		r := jsonscan.Hex4(s[i+2 : i+6])
		s = s[i+6:]
		switch {
		case r >= 0xD800 && r <= 0xDBFF && len(s) >= 6 && s[0] == '\\' && s[1] == 'u' &&
			jsonscan.Hex4(s[2:6]) >= 0xDC00 && jsonscan.Hex4(s[2:6]) <= 0xDFFF:
			n += 4
			s = s[6:]
		case r >= 0xD800 && r <= 0xDFFF:
			n += 3
		default:
			n += utf8.RuneLen(r)
		}
	}
}

// utf8Len is the length of s, unescaped JSON string text, once each byte that is not UTF-8 is
// the replacement character (3 bytes), as json.Unmarshal decodes it.
func utf8Len(s []byte) int {
	if utf8.Valid(s) {
		return len(s)
	}
	n := 0
	for len(s) > 0 {
		r, size := utf8.DecodeRune(s)
		if r == utf8.RuneError && size == 1 {
			n += 3
		} else {
			n += size
		}
		s = s[size:]
	}
	return n
}

// compactLen is the length of raw, valid JSON, without the white space between its tokens (the
// length json.Compact would give): the indentation a client lays its JSON out with is not input.
// One pass, no allocation.
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

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw) // not a string: that would copy a content to look at its ends
	return len(s) == 0 || string(s) == "null"
}
