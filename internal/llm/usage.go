package llm

import (
	"strconv"

	"github.com/llmq/llmq/internal/jsonscan"
)

// readInts reads raw, an answer's usage object (valid JSON: decoded from the answer, or marshaled
// from a stream's events), into ints: ints[i] is the integer of the key
// names[i] (lower case ASCII, as the JSON tags of the struct it stands for), as json.Unmarshal into
// a struct of int fields would: a repeated key's last value wins, a null leaves the value before,
// other keys are passed over. It reads the usual object without json's reflection (a usage was
// decoded twice per answer, once to find it and once to read it: issue 23); ok is false, ints
// then partly written, for anything else it would have to match json.Unmarshal on (a key not in
// lower case ASCII or with an escape, which json matches case-insensitively; a value of a named
// key that is not an integer or null; an integer out of range; a value that is not an object;
// JSON it sees is malformed): the caller then decodes raw with json.Unmarshal. Empty raw (no usage) is ok,
// every int 0. Bit i of reported is set when names[i]'s last value is an integer, not null or
// absent (as json.Unmarshal into a *int field would leave it non-nil: Usage.OutputUnreported).
func readInts(raw []byte, names []string, ints []int) (reported uint, ok bool) {
	clear(ints)
	if len(raw) == 0 {
		return 0, true
	}
	i := jsonscan.SkipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return 0, false
	}
	i = jsonscan.SkipSpace(raw, i+1)
	if i < len(raw) && raw[i] == '}' {
		return reported, jsonscan.SkipSpace(raw, i+1) == len(raw)
	}
	for {
		// A key: lower case ASCII, digits and _ only.
		if i >= len(raw) || raw[i] != '"' {
			return 0, false
		}
		start := i + 1
		for i = start; i < len(raw) && raw[i] != '"'; i++ {
			if c := raw[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
				return 0, false
			}
		}
		if i >= len(raw) {
			return 0, false
		}
		key := raw[start:i]
		i = jsonscan.SkipSpace(raw, i+1)
		if i >= len(raw) || raw[i] != ':' {
			return 0, false
		}
		i = jsonscan.SkipSpace(raw, i+1)
		field := -1
		for f, name := range names {
			if string(key) == name {
				field = f
				break
			}
		}
		end := jsonscan.ValueEnd(raw, i)
		if end <= i {
			return 0, false
		}
		if field >= 0 {
			v := raw[i:end]
			if string(v) == "null" { // leaves an int before, as json.Unmarshal does; a *int nil
				reported &^= 1 << field
			} else {
				n, err := strconv.ParseInt(string(v), 10, 0)
				if err != nil {
					return 0, false // a fraction, an exponent, a string, out of range...
				}
				ints[field] = int(n)
				reported |= 1 << field
			}
		}
		i = jsonscan.SkipSpace(raw, end)
		if i >= len(raw) {
			return 0, false
		}
		switch raw[i] {
		case ',':
			i = jsonscan.SkipSpace(raw, i+1)
		case '}':
			return reported, jsonscan.SkipSpace(raw, i+1) == len(raw)
		default:
			return 0, false
		}
	}
}

// reportedInt is &ints[i] when bit i of reported is set (readInts read an integer for it), else
// nil: what a *int field of json.Unmarshal would hold.
func reportedInt(reported uint, i int, ints []int) *int {
	if reported&(1<<i) == 0 {
		return nil
	}
	return &ints[i]
}

// anthropicUsage are the keys of Anthropic's usage read into Usage, in readInts' order.
var anthropicUsage = []string{"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"}

// openAIUsage are the keys of OpenAI's usage read into Usage, in readInts' order.
var openAIUsage = []string{"prompt_tokens", "completion_tokens"}
