package streamname_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/streamname"
)

// namesStream reports whether a JSON string of body, a member name at any depth included,
// decodes to "stream" (as encoding/json decodes it), reading body's tokens up to its first
// syntax error.
func namesStream(body []byte) bool {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if s, ok := tok.(string); ok && s == "stream" {
			return true
		}
	}
}

// bodies are the cases of the tests here and the seeds of the fuzz test.
var bodies = []string{
	`{"stream":true}`, `{"\u0073tream":true}`, `{"s\u0074re\u0061m":true}`, `{"strea\u006d":1}`,
	`{"strea\u006D":1}`, `{"\u0073\u0074\u0072\u0065\u0061\u006d":true}`, `{"str\u0065am":true}`,
	`{"\u0053tream":true}`, `{"Stream":true}`, `{"streams":true,"upstream":true}`,
	`{"model":"caf\u00e9","n":[1,{}]}`, `{"\"stream\"":true}`, `{"a":"\u007"}`, `{"a":"\u006`,
	`\u007`, `{"a":{"stream":true}}`, "{\"str\xffeam\":true}", `{"a":"\\u0073"}`, ``, `"stream"`,
}

// TestPossible: a body whose strings could decode to "stream" is answered true; a body with
// none, false (escaped text of other letters, a near name).
func TestPossible(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]bool{
		`{"stream":true}`:                               true,
		`{"\u0073tream":true}`:                          true,
		`{"s\u0074re\u0061m":true}`:                     true,
		`{"strea\u006d":true}`:                          true,
		`{"strea\u006D":true}`:                          true,
		`{"str\u0065am":true}`:                          true,
		`{"a":{"stream":true}}`:                         true,
		`{"a":"\\u0073"}`:                               true, // a maybe: an escaped backslash, then text
		`{"\u0053tream":true}`:                          false,
		`{"Stream":true}`:                               false,
		`{"streams":true,"upstream":true}`:              false,
		`{"model":"caf\u00e9 \u6771\u4eac","n":[1,{}]}`: false,
		`{"\"stream\"":true}`:                           false,
		`{"a":"\u007"}`:                                 false, // cut short: no letter named
		``:                                              false,
	} {
		require.Equal(t, want, streamname.Possible([]byte(body)), "%s", body)
	}
}

// TestPossible_NoneMissed: a body with a string that decodes to "stream" is never answered
// false, however its name is written.
func TestPossible_NoneMissed(t *testing.T) {
	t.Parallel()
	for _, body := range bodies {
		if namesStream([]byte(body)) {
			require.True(t, streamname.Possible([]byte(body)), "%s", body)
		}
	}
	// Every spelling of "stream" with any of its letters escaped, in either hex case.
	const word = "stream"
	for mask := range 1 << len(word) {
		for _, format := range []string{`\u%04x`, `\u%04X`} {
			var b strings.Builder
			for i, c := range word {
				if mask&(1<<i) == 0 {
					b.WriteRune(c)
				} else {
					fmt.Fprintf(&b, format, c)
				}
			}
			body := []byte(`{"model":"m","` + b.String() + `":true}`)
			require.True(t, namesStream(body), "%s", body)
			require.True(t, streamname.Possible(body), "%s", body)
		}
	}
}

// FuzzPossible: a false answer is certain; no string of the body decodes to "stream".
func FuzzPossible(f *testing.F) {
	for _, body := range bodies {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !streamname.Possible(body) && namesStream(body) {
			t.Fatalf("%q names stream, answered false", body)
		}
	})
}

// TestPossible_NoAllocation: the scan reads body in place, however long.
func TestPossible_NoAllocation(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's
	body := []byte(`{"messages":[{"content":"` + strings.Repeat(`caf\u00e9 \u6771`, 20_000) + `"}]}`)
	got := true
	allocs := testing.AllocsPerRun(5, func() { got = streamname.Possible(body) })
	require.False(t, got)
	require.Zero(t, allocs)
}
