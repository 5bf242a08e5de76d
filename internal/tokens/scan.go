package tokens

import "github.com/llmq/llmq/internal/jsonscan"

// scanBody reads data into b as json.Unmarshal would, without its reflection (its decode of a
// request was most of a count's instructions, and the worker counts every job's at admission:
// issue 23): each field a slice of data, a repeated key's last value winning. It checks data as
// it reads it (json.Valid before it was most of what was left: jsonscan.Value checks each value
// as it passes over it), and reads the usual body, valid JSON whose keys are lower case ASCII and
// whose messages are an array of objects; ok is false, b then partly written, for anything else
// (a key json would match case-insensitively or through an escape; messages given twice, or not
// an array of objects; data not a JSON object, or not valid, or nested deeper than
// jsonscan.MaxDepth): the caller then decodes data with json.Unmarshal, which says what is wrong.
// It never reads outside data, whatever data is.
func scanBody(data []byte, b *fields) (ok bool) {
	seenMessages := false
	obj := jsonscan.ObjectAt(data, jsonscan.SkipSpace(data, 0), jsonscan.LowerKeys)
	for obj.Next() {
		i := obj.Value
		if string(obj.Key) == "messages" {
			if seenMessages { // json would decode the second array into the first's messages
				return false
			}
			seenMessages = true
			obj.ValueEnds(scanMessages(data, i, b))
			continue
		}
		end := jsonscan.Value(data, i)
		if end < 0 {
			return false
		}
		v := data[i:end]
		switch string(obj.Key) {
		case "model":
			b.Model = v
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
		obj.ValueEnds(end)
	}
	end := obj.End()
	return end >= 0 && jsonscan.SkipSpace(data, end) == len(data) // white space only after it
}

// scanMessages reads the value of messages at data[i] into b.Messages and returns the index just
// past it: null is none, an array of objects (or nulls, zero messages) their contents and tool
// calls. Anything else, valid or not, is -1.
func scanMessages(data []byte, i int, b *fields) int {
	if i >= len(data) {
		return -1
	}
	if data[i] == 'n' {
		end := jsonscan.Value(data, i)
		if end < 0 || string(data[i:end]) != "null" {
			return -1
		}
		b.Messages = nil
		return end
	}
	if data[i] != '[' {
		return -1
	}
	b.Messages = b.Messages[:0]
	i = jsonscan.SkipSpace(data, i+1)
	if i < len(data) && data[i] == ']' {
		return i + 1
	}
	for {
		if i >= len(data) {
			return -1
		}
		var m messageFields
		switch data[i] {
		case 'n': // null: a zero message
			end := jsonscan.Value(data, i)
			if end < 0 || string(data[i:end]) != "null" {
				return -1
			}
			i = end
		case '{':
			obj := jsonscan.ObjectAt(data, i, jsonscan.LowerKeys)
			for obj.Next() {
				end := jsonscan.Value(data, obj.Value)
				if end < 0 {
					return -1
				}
				switch string(obj.Key) {
				case "content":
					m.Content = data[obj.Value:end]
				case "tool_calls":
					m.ToolCalls = data[obj.Value:end]
				}
				obj.ValueEnds(end)
			}
			if i = obj.End(); i < 0 {
				return -1
			}
		default:
			return -1
		}
		b.Messages = append(b.Messages, m)
		if i = jsonscan.SkipSpace(data, i); i >= len(data) {
			return -1
		}
		switch data[i] {
		case ']':
			return i + 1
		case ',':
			i = jsonscan.SkipSpace(data, i+1)
		default:
			return -1
		}
	}
}
