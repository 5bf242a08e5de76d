package llm

import (
	"encoding/json"

	"github.com/llmq/llmq/internal/jsonscan"
)

// answerMembers reads data, a 2xx answer that starts with an object, for what Send needs of it:
// the raw values of its top-level "usage" and "error" (nil when absent). Its results and error
// are json.Unmarshal's into a struct of two json.RawMessage fields tagged so: the whole answer
// checked valid, the keys matched case-insensitively, a repeated key's last value kept. The
// usual answer is walked once without reflection (its json.Unmarshal was ~27 k instructions a
// job, issue 23); an answer the walk cannot match json on for sure (invalid JSON, nesting past
// jsonscan.MaxDepth, a key with an escape or a non-ASCII byte, which json may fold to "usage"
// or "error") is decoded by json.Unmarshal, whose error is returned as it is.
func answerMembers(data []byte) (usage, errRaw []byte, err error) {
	if usage, errRaw, ok := scanAnswer(data); ok {
		return usage, errRaw, nil
	}
	var top struct {
		Usage json.RawMessage `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	// Unmarshal checks the whole answer is valid JSON before it decodes.
	if err := json.Unmarshal(data, &top); err != nil {
		return nil, nil, err
	}
	return top.Usage, top.Error, nil
}

// scanAnswer is answerMembers' walk: ok is false when data is not an object it reads for sure,
// usage and errRaw (slices of data) then meaningless.
func scanAnswer(data []byte) (usage, errRaw []byte, ok bool) {
	i := jsonscan.SkipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, nil, false
	}
	i = jsonscan.SkipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		return nil, nil, jsonscan.SkipSpace(data, i+1) == len(data)
	}
	for {
		if i >= len(data) || data[i] != '"' {
			return nil, nil, false
		}
		start := i + 1
		for i = start; i < len(data) && data[i] != '"'; i++ {
			if c := data[i]; c < 0x20 || c == '\\' || c >= 0x80 {
				return nil, nil, false // json unescapes and folds such a key: its decode says
			}
		}
		if i >= len(data) {
			return nil, nil, false
		}
		key := data[start:i]
		if i = jsonscan.SkipSpace(data, i+1); i >= len(data) || data[i] != ':' {
			return nil, nil, false
		}
		i = jsonscan.SkipSpace(data, i+1)
		end := jsonscan.Value(data, i)
		if end < 0 {
			return nil, nil, false
		}
		switch {
		case equalFoldASCII(key, "usage"):
			usage = data[i:end]
		case equalFoldASCII(key, "error"):
			errRaw = data[i:end]
		}
		if i = jsonscan.SkipSpace(data, end); i >= len(data) {
			return nil, nil, false
		}
		switch data[i] {
		case ',':
			i = jsonscan.SkipSpace(data, i+1)
		case '}':
			return usage, errRaw, jsonscan.SkipSpace(data, i+1) == len(data)
		default:
			return nil, nil, false
		}
	}
}

// equalFoldASCII reports whether key, ASCII, is name (lower case ASCII letters) in any case, as
// json matches a key to a field's name.
func equalFoldASCII(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for j := range key {
		if c := key[j]; c != name[j] && c|0x20 != name[j] {
			return false
		}
	}
	return true
}
