package jsonscan_test

import (
	"encoding/json"
	"strings"
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

// validCases are texts Valid must judge as json.Valid does: valid JSON of every kind, and text
// malformed at every place a hand reader could slip.
var validCases = []string{
	`{}`, ` { } `, `[]`, `[1,2]`, `{"a":1,"b":[true,false,null],"c":{"d":"e"}}`, `"s"`, `0`, `-0`, `1.5`, `-1.5e+3`,
	`1E9`, `1e-0`, `"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"`, "\"\xff\xfe\"", `"é"`, ` null `, "\t\r\n[]\n",
	``, ` `, `{`, `}`, `[`, `]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,"a":1}`, `{"a" 1}`, `{a:1}`,
	`{"a":1 "b":2}`, `[1 2]`, `"open`, `"\`, `"\x"`, `"\u12"`, `"\u12G4"`, "\"a\x01\"", "\"\t\"", `01`, `-`, `-a`,
	`1.`, `1.e3`, `.5`, `1e`, `1e+`, `+1`, `tru`, `truex`, `nul`, `nulll`, `falsey`, `[true false]`, `{}{}`, `{} x`,
	`[1]]`, `{"a":1}}`, `[{]}`, `{"a":[}`, `"a"b`, `NaN`, `Infinity`, `{"\u0061":1}`, "\v{}", `[-]`, `[1e5,-0.0]`,
}

// TestValid: Valid agrees with json.Valid, and Value on valid JSON ends where the value ends.
func TestValid(t *testing.T) {
	t.Parallel()
	for _, data := range validCases {
		requireValidAsJSON(t, []byte(data))
	}
	require.True(t, jsonscan.Valid([]byte(strings.Repeat("[", 600)+strings.Repeat("]", 600))),
		"deeper than MaxDepth: json.Valid judges it")
	require.False(t, jsonscan.Valid([]byte(strings.Repeat("[", 600)+strings.Repeat("]", 599))))
	require.Equal(t, -1, jsonscan.Value([]byte(strings.Repeat("[", 600)+strings.Repeat("]", 600)), 0),
		"deeper than MaxDepth: Value leaves it to encoding/json")
	for _, v := range values {
		for _, after := range []string{"", ",", "}", "]", " ", "x"} {
			data := []byte(`[` + v + after)
			require.Equal(t, 1+len(v), jsonscan.Value(data, 1), "%q", data)
		}
	}
	require.Equal(t, -1, jsonscan.Value([]byte(`[]`), 2), "at the end of data")
	require.Equal(t, -1, jsonscan.Value([]byte(`[]`), 1), "at a closing bracket")
	require.Equal(t, -1, jsonscan.StringEnd([]byte(`"a`), 0))
	require.Equal(t, 3, jsonscan.StringEnd([]byte(`"a"`), 0))
}

// FuzzValid: Valid is json.Valid, and Value never reads outside data.
func FuzzValid(f *testing.F) {
	for _, data := range validCases {
		f.Add([]byte(data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		requireValidAsJSON(t, data)
	})
}

func requireValidAsJSON(t *testing.T, data []byte) {
	t.Helper()
	require.Equal(t, json.Valid(data), jsonscan.Valid(data), "%q", data)
	for i := range len(data) + 1 {
		if end := jsonscan.Value(data, i); end >= 0 {
			require.True(t, json.Valid(data[i:end]), "Value(%q, %d) = %d", data, i, end)
		}
	}
}

// TestHex4: the digits of a \u escape, in either case, and only the first four.
func TestHex4(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]rune{"0000": 0, "00e9": 0xe9, "DBFF": 0xdbff, "aBcD": 0xabcd, "2028x": 0x2028} {
		require.Equal(t, want, jsonscan.Hex4([]byte(s)), s)
	}
}
