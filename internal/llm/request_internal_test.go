package llm

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCheckRequestBody: a JSON object passes and anything else is refused, whether or not it could
// name "stream"; stream is read from the member the decoder reads, its name escaped or not, and
// only true asks for a stream.
func TestCheckRequestBody(t *testing.T) {
	t.Parallel()
	for _, body := range []string{"", " ", "null", "[]", `"text"`, "42", "{", `{"a":1} trailing`, `{"a":}`,
		`{"stream":true} trailing`, `{"stream":tru}`, `{"\u0073tream":}`, "\xff"} {
		_, _, err := checkRequestBody([]byte(body))
		require.ErrorIs(t, err, ErrInvalidRequest, "body %q", body)
	}
	for body, want := range map[string]bool{
		`{}`:                               false,
		" \n{\"model\":\"m\"}\t":           false,
		`{"model":"caf\u00e9","n":[1,{}]}`: false,
		`{"stream":true}`:                  true,
		`{"stream" : true ,"model":"m"}`:   true,
		`{"stream":false}`:                 false,
		`{"stream":"true"}`:                false,
		`{"stream":true,"stream":false}`:   false,
		`{"stream":false,"stream":true}`:   true,
		`{"\u0073tream":true}`:             true,
		`{"strea\u006D":true}`:             true,
		`{"model":"\"stream\"","x":true}`:  false,
		`{"streams":true,"upstream":true}`: false,
		`{"messages":[{"stream":true}]}`:   false,
	} {
		stream, top, err := checkRequestBody([]byte(body))
		require.NoError(t, err, "body %q", body)
		require.Equal(t, want, stream, "body %q", body)
		if stream {
			require.NotNil(t, top, "body %q: a stream's members are kept (withStreamUsage reads them)", body)
		}
	}
}

// TestCheckRequestBody_NoCopyWithoutStream: a body that cannot name "stream" (most) is validated
// in place, its members not decoded into a map of copies (a worker checks every request it
// sends: callgrind put the map's decode at 3% of a worker's instructions per job).
func TestCheckRequestBody_NoCopyWithoutStream(t *testing.T) {
	body := []byte(`{"model":"claude","max_tokens":16,"messages":[{"role":"user","content":"hello \u00e9"}]}`)
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := checkRequestBody(body); err != nil {
			t.Fatal(err)
		}
	})
	// json.Valid's scanner and its state: 2, 3 under -race; the map's decode made 18.
	require.LessOrEqual(t, allocs, 4.0)
}

// decodeCheckRequestBody is checkRequestBody as it was before its fast path: every body decoded
// into a map of its members. The fast path must answer as it does.
func decodeCheckRequestBody(body []byte) (stream bool, top map[string]json.RawMessage, err error) {
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return false, nil, fmt.Errorf("%w: body is not a JSON object", ErrInvalidRequest)
	}
	if raw, ok := top["stream"]; ok {
		_ = json.Unmarshal(raw, &stream)
	}
	return stream, top, nil
}

// requestBodies are the edges of checkRequestBody's fast path: names escaped whole or in part
// (either hex case, letters of other words), "stream" in values and nested members, duplicate
// names, bodies that are not objects, bad UTF-8, white space JSON has and has not, a BOM, two
// values, depth past the decoder's limit, and large bodies.
func requestBodies() []string {
	text := strings.Repeat(`Gr\u00fc\u00dfe caf\u00e9 \u6771\u4eac `, 20_000)
	deep := strings.Repeat(`{"a":`, 10_001) + "1" + strings.Repeat("}", 10_001)
	return []string{
		``, ` `, "\t\r\n", `null`, `[]`, `[{"stream":true}]`, `"stream"`, `42`, `true`, `{`, `}`,
		`{"a":1} trailing`, `{"a":1}{"b":2}`, `{"stream":true}{"b":2}`, `{"a":}`, `{"a":1,}`,
		`{"stream":true} trailing`, `{"stream":tru}`, `{"\u0073tream":}`, `{"stream":true`,
		"\xff", "{\xff}", "{\"a\":\"\xff\"}", "{\"str\xffeam\":true}", "{\"stream\":\"\xff\"}",
		"\xef\xbb\xbf{}", "\xef\xbb\xbf{\"stream\":true}", "\f{}", "\v{}", "\u00a0{}", "{}\f",
		" \n{\"model\":\"m\"}\t\r\n", "\x00{}", "{}\x00", `{"a":"\u00"}`, `{"a":"\u007"}`, `{"a":"\x"}`,
		`{}`, `{"model":"caf\u00e9","n":[1,{}]}`, `{"a":1e999,"b":-0.0}`, `{"a":-}`, `{"\ud800":1}`,
		`{"stream":true}`, `{"stream" : true ,"model":"m"}`, `{"stream":false}`, `{"stream":"true"}`,
		`{"stream":1}`, `{"stream":null}`, `{"stream":{}}`, `{"stream":true,"stream":false}`,
		`{"stream":false,"stream":true}`, `{"\u0073tream":true}`, `{"strea\u006D":true}`,
		`{"strea\u006d":true}`, `{"s\u0074r\u0065\u0061m":true}`, `{"\u0073\u0074\u0072\u0065\u0061\u006D":true}`,
		`{"\u0053tream":true}`, `{"Stream":true}`, `{"STREAM":true}`, `{"stream ":true}`,
		`{"\"stream\"":true}`, `{"model":"\"stream\"","x":true}`, `{"streams":true,"upstream":true}`,
		`{"messages":[{"stream":true}]}`, `{"a":"\u0073"}`, `{"a":"\\u0073tream"}`,
		`{"stream":false,"\u0073tream":true}`, `{"\u0073tream":true,"stream":false}`,
		`{"messages":[{"content":"` + text + `"}]}`, `{"stream":true,"messages":[{"content":"` + text + `"}]}`,
		`{"messages":[{"content":"` + text + `"}]`, deep, `{"x":` + deep + `}`,
	}
}

// TestCheckRequestBody_AsTheDecodeDid: on every edge, checkRequestBody refuses, accepts and reads
// "stream" as the full decode did, and gives the decode's members whenever it gives them (nil
// only when no member is named "stream").
func TestCheckRequestBody_AsTheDecodeDid(t *testing.T) {
	t.Parallel()
	for _, body := range requestBodies() {
		sameAsDecode(t, []byte(body))
	}
}

// FuzzCheckRequestBody: as TestCheckRequestBody_AsTheDecodeDid, on any body.
func FuzzCheckRequestBody(f *testing.F) {
	for _, body := range requestBodies() {
		if len(body) < 1000 {
			f.Add([]byte(body))
		}
	}
	f.Fuzz(sameAsDecode)
}

func sameAsDecode(t *testing.T, body []byte) {
	t.Helper()
	name := body
	if len(name) > 80 {
		name = name[:80]
	}
	stream, top, err := checkRequestBody(body)
	wantStream, wantTop, wantErr := decodeCheckRequestBody(body)
	require.Equal(t, wantErr == nil, err == nil, "body %q: refused? %v", name, err)
	if err != nil {
		require.ErrorIs(t, err, ErrInvalidRequest, "body %q", name)
		require.EqualError(t, err, wantErr.Error(), "body %q", name)
		return
	}
	require.Equal(t, wantStream, stream, "body %q", name)
	if top == nil {
		_, named := wantTop["stream"]
		require.False(t, named, "body %q: no members given, yet one is named stream", name)
		return
	}
	require.Equal(t, wantTop, top, "body %q", name)
}
