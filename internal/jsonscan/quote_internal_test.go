package jsonscan

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// stateLoopValueEnd is ValueEnd as it was before it shared closingQuote with depthExceeded: the
// reference it must match on any data.
func stateLoopValueEnd(data []byte, i int) int {
	depth, inString, escaped := 0, false, false
	for j := i; j < len(data); j++ {
		c := data[j]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
				if depth == 0 {
					return j + 1
				}
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth == 0 {
				return j
			}
			if depth--; depth == 0 {
				return j + 1
			}
		case depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return j
		}
	}
	return len(data)
}

// stateLoopDepthExceeded is depthExceeded as it was before it shared closingQuote.
func stateLoopDepthExceeded(data []byte, i int) bool {
	depth, inString, escaped := 0, false, false
	for _, c := range data[min(i, len(data)):] {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			if depth++; depth > MaxDepth {
				return true
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return false
}

// quoteCases are texts whose strings the loops pass over: escapes, quotes and brackets in
// strings, strings left open, nesting about MaxDepth.
var quoteCases = []string{
	`"plain"`, `"a\"b\\"`, `"\\"`, `"}],{["`, `""`, `"\u0022"`, `"\`, `"open`, `"a\\\"`, `{"a":[1,{"b":"}"}],"c":"]"}`,
	`[[[]],{}]`, `{ "a" : [ 1 , 2 ] }`, `-1.5e+3`, `true,`, `null]`, `[1,2`, `{"a":"\"}`, `x"y"z`, `]`, ``,
	strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
	strings.Repeat(`["\"[",`, MaxDepth+1), strings.Repeat(`["[",`, MaxDepth) + `"`,
}

// TestClosingQuote_AsTheStateLoops: ValueEnd and depthExceeded answer as the loops that tracked
// strings with a state of their own did, from every index.
func TestClosingQuote_AsTheStateLoops(t *testing.T) {
	t.Parallel()
	for _, data := range quoteCases {
		requireAsTheStateLoops(t, []byte(data))
	}
}

// FuzzClosingQuote_AsTheStateLoops: as TestClosingQuote_AsTheStateLoops, on any data.
func FuzzClosingQuote_AsTheStateLoops(f *testing.F) {
	for _, data := range quoteCases {
		f.Add([]byte(data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		requireAsTheStateLoops(t, data)
	})
}

func requireAsTheStateLoops(t *testing.T, data []byte) {
	t.Helper()
	for i := range len(data) + 1 { // compared without require: it is called len(data) times
		if want, got := stateLoopValueEnd(data, i), ValueEnd(data, i); got != want {
			require.Equal(t, want, got, "ValueEnd(%q, %d)", data, i)
		}
		if want, got := stateLoopDepthExceeded(data, i), depthExceeded(data, i); got != want {
			require.Equal(t, want, got, "depthExceeded(%q, %d)", data, i)
		}
	}
}
