package jsonscan_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jsonscan"
)

// values are JSON values whose ends ValueEnd must find, each followed by what may follow a value.
var values = []string{
	`"plain"`, `"a\"b\\"`, `"\\"`, `"}],{["`, `""`, `"\u0022"`,
	`{}`, `[]`, `{"a":[1,{"b":"}"}],"c":"]"}`, `[[[]],{}]`, `{ "a" : [ 1 , 2 ] }`,
	`0`, `-1.5e+3`, `true`, `false`, `null`,
}

// TestValueEnd: the end of each value, whatever follows it in an object or an array, and
// wherever it starts.
func TestValueEnd(t *testing.T) {
	t.Parallel()
	for _, v := range values {
		require.True(t, json.Valid([]byte(v)), v)
		for _, after := range []string{"", ",", "}", "]", " ", "\t,", "\n}", "\r]"} {
			data := []byte(`[` + v + after)
			require.Equal(t, 1+len(v), jsonscan.ValueEnd(data, 1), "%q", data)
		}
	}
	require.Equal(t, 0, jsonscan.ValueEnd(nil, 0))
	require.Equal(t, 1, jsonscan.ValueEnd([]byte(`[]`), 1), "at a bracket closing what would hold a value: no value")
}

// TestValueEnd_Malformed: on text that is not JSON ValueEnd stays within it.
func TestValueEnd_Malformed(t *testing.T) {
	t.Parallel()
	for _, data := range []string{`"open`, `{"a":`, `[1,2`, `"\`, `{`} {
		require.Equal(t, len(data), jsonscan.ValueEnd([]byte(data), 0), data)
	}
}

// TestSkipSpace: JSON's four white space bytes only.
func TestSkipSpace(t *testing.T) {
	t.Parallel()
	require.Equal(t, 4, jsonscan.SkipSpace([]byte(" \t\r\nx"), 0))
	require.Equal(t, 5, jsonscan.SkipSpace([]byte("x \n\r\t"), 1))
	require.Equal(t, 0, jsonscan.SkipSpace([]byte("\v "), 0), "a vertical tab is not JSON white space")
	require.Equal(t, 3, jsonscan.SkipSpace([]byte("abc"), 3))
}
