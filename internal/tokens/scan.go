package tokens

import (
	"encoding/json"

	"github.com/llmq/llmq/internal/jsonscan"
)

// scanBody reads data into b as json.Unmarshal would, without its reflection (its decode of a
// request was most of a count's instructions, and the worker counts every job's at admission:
// issue 23): each field a slice of data, a repeated key's last value winning. It reads the usual
// body, valid JSON whose keys are lower case ASCII and whose messages are an array of objects; ok
// is false, b then partly written, for anything else (a key json would match case-insensitively
// or through an escape; messages given twice, or not an array of objects; data not a JSON
// object, or not valid): the caller then decodes data with json.Unmarshal, which says what is
// wrong.
func scanBody(data []byte, b *fields) (ok bool) {
	if !json.Valid(data) {
		return false
	}
	seenMessages := false
	return scanObject(data, jsonscan.SkipSpace(data, 0), func(key, v []byte) bool {
		switch string(key) {
		case "model":
			b.Model = v
		case "messages":
			if seenMessages { // json would decode the second array into the first's messages
				return false
			}
			seenMessages = true
			return scanMessages(v, b)
		case "system":
			b.System = v
		case "tools":
			b.Tools = v
		case "max_tokens":
			b.MaxTokens = v
		case "max_completion_tokens":
			b.MaxCompletionTokens = v
		case "n":
			b.N = v
		case "response_format":
			b.ResponseFormat = v
		}
		return true
	}) >= 0 // white space only after it: data is valid
}

// scanMessages reads v, the value of messages, into b.Messages: null is none, an array of
// objects (or nulls, zero messages) their contents and tool calls. Anything else is not ok.
func scanMessages(v []byte, b *fields) bool {
	if string(v) == "null" {
		b.Messages = nil
		return true
	}
	if v[0] != '[' {
		return false
	}
	b.Messages = b.Messages[:0]
	i := jsonscan.SkipSpace(v, 1)
	if v[i] == ']' {
		return true
	}
	for {
		var m messageFields
		switch v[i] {
		case 'n': // null: a zero message
			i += len("null")
		case '{':
			i = scanObject(v, i, func(key, v []byte) bool {
				switch string(key) {
				case "content":
					m.Content = v
				case "tool_calls":
					m.ToolCalls = v
				}
				return true
			})
			if i < 0 {
				return false
			}
		default:
			return false
		}
		b.Messages = append(b.Messages, m)
		i = jsonscan.SkipSpace(v, i)
		if v[i] == ']' {
			return true
		}
		i = jsonscan.SkipSpace(v, i+1) // the comma
	}
}

// scanObject reads the object of valid JSON at data[i], calling field with each key and value
// (the value's bytes, without white space around them), and returns the index just past the
// object. It returns -1 when field does, or at a key that is not lower case ASCII, digits and _
// only (json.Unmarshal matches keys case-insensitively, and a key may hold escapes).
func scanObject(data []byte, i int, field func(key, v []byte) bool) int {
	if i >= len(data) || data[i] != '{' {
		return -1
	}
	i = jsonscan.SkipSpace(data, i+1)
	if data[i] == '}' {
		return i + 1
	}
	for {
		start := i + 1 // data[i] is the key's quote
		for i = start; data[i] != '"'; i++ {
			if c := data[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return -1
			}
		}
		key := data[start:i]
		i = jsonscan.SkipSpace(data, jsonscan.SkipSpace(data, i+1)+1) // past the colon
		end := jsonscan.ValueEnd(data, i)
		if !field(key, data[i:end]) {
			return -1
		}
		i = jsonscan.SkipSpace(data, end)
		if data[i] == '}' {
			return i + 1
		}
		i = jsonscan.SkipSpace(data, i+1) // the comma
	}
}
