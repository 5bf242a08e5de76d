package api

import (
	"unicode/utf8"

	"github.com/llmq/llmq/internal/jsonscan"
)

// scanSubmit is decodeSubmit's walk of the usual body, without encoding/json's reflection (its
// Decoder was ~21 k instructions a job, issue 23): b is what decodeSubmitJSON decodes body to,
// and ok is true, only when body is one JSON object with white space around it, whose keys are
// the contract's names, spelled exactly (no escape) and each sent once, and whose values are
// ones the walk decodes exactly as encoding/json does: null, or a string without escapes and of
// UTF-8 for a string field, an array of such strings for fallbacks, a number for max_attempts
// that integral reads, and any valid JSON (nested at most jsonscan.MaxDepth) for request and
// metadata. On anything else ok is false (b meaningless): the caller decodes body with
// encoding/json, whose errors are the client's answer. request and metadata are slices of body
// whose capacity ends with them, so that an append to one never writes over body.
func scanSubmit(body []byte) (b submitBody, ok bool) {
	i := jsonscan.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return b, false
	}
	i = jsonscan.SkipSpace(body, i+1)
	if i < len(body) && body[i] == '}' {
		return b, jsonscan.SkipSpace(body, i+1) == len(body)
	}
	var seen uint16
	for {
		if i >= len(body) || body[i] != '"' {
			return b, false
		}
		start := i + 1
		for i = start; i < len(body) && body[i] != '"'; i++ {
			if c := body[i]; c < 0x20 || c == '\\' || c >= 0x80 {
				return b, false
			}
		}
		if i >= len(body) {
			return b, false
		}
		key := body[start:i]
		if i = jsonscan.SkipSpace(body, i+1); i >= len(body) || body[i] != ':' {
			return b, false
		}
		i = jsonscan.SkipSpace(body, i+1)
		end := jsonscan.Value(body, i)
		if end < 0 {
			return b, false
		}
		f := submitField(key)
		if f < 0 || seen&(1<<f) != 0 || !b.set(f, body[i:end:end]) {
			return b, false
		}
		seen |= 1 << f
		if i = jsonscan.SkipSpace(body, end); i >= len(body) {
			return b, false
		}
		switch body[i] {
		case ',':
			i = jsonscan.SkipSpace(body, i+1)
		case '}':
			return b, jsonscan.SkipSpace(body, i+1) == len(body)
		default:
			return b, false
		}
	}
}

// submitFields are the submit body's names, as submitBody's tags spell them; a name's index is
// its bit in scanSubmit's record of the names seen.
var submitFields = [...]string{"credential", "request", "timeout", "attempt_timeout", "first_byte_timeout",
	"max_attempts", "metadata", "fallbacks", "lane", "priority"}

// submitField is the index of key in submitFields, -1 when it is none of them.
func submitField(key []byte) int {
	for f, name := range submitFields {
		if string(key) == name {
			return f
		}
	}
	return -1
}

// set stores v, a valid JSON value, in the field submitFields[f] as encoding/json would: false
// when the walk cannot be sure it does (see scanSubmit).
func (b *submitBody) set(f int, v []byte) bool {
	null := string(v) == "null"
	switch submitFields[f] {
	case "request":
		b.Request = v // a json.RawMessage keeps null as "null"
	case "metadata":
		b.Metadata = v
	case "credential":
		return setStringPtr(&b.Credential, v, null)
	case "timeout":
		return setStringPtr(&b.Timeout, v, null)
	case "attempt_timeout":
		return setStringPtr(&b.AttemptTimeout, v, null)
	case "first_byte_timeout":
		return setStringPtr(&b.FirstByteTimeout, v, null)
	case "lane":
		return setStringPtr(&b.Lane, v, null)
	case "priority":
		return setStringPtr(&b.Priority, v, null)
	case "max_attempts":
		if null {
			b.MaxAttempts = nil
			return true
		}
		if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
			return false
		}
		n := new(integral)
		if n.UnmarshalJSON(v) != nil {
			return false
		}
		b.MaxAttempts = n
	case "fallbacks":
		if null {
			b.Fallbacks = nil
			return true
		}
		fallbacks, ok := plainStrings(v)
		b.Fallbacks = fallbacks
		return ok
	}
	return true
}

// setStringPtr stores v, a JSON string or null (null: nil), in *dst as encoding/json would;
// false when it is not sure to (see plainString).
func setStringPtr(dst **string, v []byte, null bool) bool {
	if null {
		*dst = nil
		return true
	}
	s, ok := plainString(v)
	if !ok {
		return false
	}
	*dst = &s
	return true
}

// plainString is v, a valid JSON value, decoded as a string when it is a string without escapes
// and of UTF-8 (encoding/json decodes such a string to its bytes); ok is false otherwise.
func plainString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	s := v[1 : len(v)-1]
	for _, c := range s {
		if c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(s) {
		return "", false
	}
	return string(s), true
}

// plainStrings is v, a valid JSON value, decoded as a []string when it is an array of strings
// plainString reads ([] is an empty slice, not nil, as encoding/json decodes it).
func plainStrings(v []byte) ([]string, bool) {
	if v[0] != '[' {
		return nil, false
	}
	out := []string{}
	i := jsonscan.SkipSpace(v, 1)
	if v[i] == ']' {
		return out, true
	}
	for {
		end := jsonscan.StringEnd(v, i)
		if end < 0 {
			return nil, false
		}
		s, ok := plainString(v[i:end])
		if !ok {
			return nil, false
		}
		out = append(out, s)
		i = jsonscan.SkipSpace(v, end)
		switch v[i] { // v is a valid array: a comma or its closing bracket
		case ',':
			i = jsonscan.SkipSpace(v, i+1)
		default:
			return out, true
		}
	}
}
