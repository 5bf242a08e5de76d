// Package streamname tells, without decoding a JSON request body, whether it may hold a member
// named "stream": the one member llm's Send and deltastream.Requested read to know whether a job
// streams. Most bodies cannot, and both then skip a decode of the whole body.
package streamname

import (
	"bytes"
	"strings"
)

// Possible reports whether body holds a JSON string that could decode to "stream": spelled so,
// or with one of its letters escaped (\u0073, \u0074, \u0072, \u0065, \u0061, \u006d or
// \u006D), as a string written otherwise must be (JSON's only escapes of a letter are \u ones;
// its hex digits here are all digits but m's d). False is certain: no string of body, a member
// name at any depth included, decodes to "stream". True is a maybe (the text of a value, a
// nested member, a letter of another word escaped): the caller decodes. Bodies with non-ASCII
// text escaped (\u00e9, as Python writes them) and no "stream" are answered false.
func Possible(body []byte) bool {
	return bytes.Contains(body, []byte(`"stream"`)) || escapesOneOf(body, `\u007`, "234") || escapesOneOf(body, `\u006`, "15dD")
}

// escapesOneOf reports whether body holds prefix followed by one of the bytes of last.
func escapesOneOf(body []byte, prefix, last string) bool {
	for {
		i := bytes.Index(body, []byte(prefix))
		if i < 0 || i+len(prefix) >= len(body) {
			return false
		}
		body = body[i+len(prefix):]
		if strings.IndexByte(last, body[0]) >= 0 {
			return true
		}
	}
}
