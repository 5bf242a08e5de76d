package llm

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// answerCases are answers answerMembers must read as json.Unmarshal does: the usual, and every
// way the walk could part from the decode (key case and escapes, repeats, null, nesting, space,
// malformed or cut JSON).
var answerCases = []string{
	`{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],"usage":{"input_tokens":12,"output_tokens":3}}`,
	`{"id":"c1","choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`,
	`{}`, ` { } `, "\t{\"usage\" : { \"a\" : 1 } , \"error\" :\nnull }\r\n",
	`{"usage":null}`, `{"usage":{"a":1},"usage":null}`, `{"usage":null,"usage":{"a":1}}`,
	`{"usage":1,"Usage":2}`, `{"USAGE":{}}`, `{"uSaGe":[1,2]}`, `{"Error":{"type":"x"}}`, `{"ERROR":"boom"}`,
	`{"error":{"message":"m"},"error":{}}`, `{"error":"","usage":""}`, `{"errors":1,"usages":2,"use":3}`,
	`{"\u0075sage":{"a":1}}`, `{"u\u017fage":{"a":1}}`, "{\"u\u017fage\":{\"a\":1}}", "{\"usag\xc3\xa9\":1}",
	`{"\u0065rror":"x"}`, "{\"e\xffrror\":1}", `{"a\"b":1,"usage":2}`, `{"usage":"\"}{"}`,
	`{"usage":{"a":[1,{"b":"}"}]}}`, `{"usage":true,"error":false}`, `{"usage":-1.5e3}`,
	`{`, `{"usage":`, `{"usage":{"a":1}`, `{"usage":1,}`, `{"usage" 1}`, `{usage:1}`, `{"usage":1} x`,
	`{"usage":1}}`, `{"a":1 "b":2}`, `{"a":[}`, `{"a":01}`, `{"a":"` + "\x01" + `"}`, `{"a":tru}`, `{"a":nul}`,
	`{"usage":1}{}`, "{\"a\":\"\xff\xfe\"}", `{"usage":{"a":1},"error":{"b":2}}`,
	`{"a":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `,"usage":{"x":1}}`,
	`{"a":` + strings.Repeat("[", 600) + strings.Repeat("]", 599) + `}`,
	`{"usage":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`,
	`{"a":` + strings.Repeat("[", 510) + strings.Repeat("]", 510) + `,"error":"x"}`,
	// json folds keys as bytes.EqualFold: the Kelvin sign and the long s (raw or escaped) fall back.
	"{\"\u212a\":1,\"u\xc5\xbfage\":{\"a\":1}}", `{"\u212a":1,"error\u0000":2}`, `{"\u0055SAGE":3}`, `{"":1,"usage":2}`,
	`{"usage":1e400}`, `{"usage":{"input_tokens":1e400,"output_tokens":-0.0e-0}}`, `{"usage":1E+2}`,
	`{"a":-}`, `{"a":1.}`, `{"a":.5}`, `{"a":1e}`, `{"a":-01}`, `{"a":+1}`, `{"a":0x1}`, `{"a":NaN}`,
	`{"usage":"\ud800"}`, `{"error":"\udc00\ud800x"}`, `{"a":"\u00zz"}`, `{"a":"\x"}`, `{"a":"\u12"}`,
	"{\"a\":\"\x7f\xc0\xaf\"}", "{\"usage\":1,\v\"a\":2}", "{\"usage\":1}\x00", "{\"usage\":1}\u00a0",
	"\xef\xbb\xbf{\"usage\":1}", `[{"usage":1}]`, `"usage"`, `null`, ` `, ``, `{"usage":1,"usage"}`, `{"usage":1,}`,
	`{"usage":{},"error":[],"usage":[],"error":{}}`, `{"usage" :{"a":"b"}, "Error" : "e" , "ERROR":null}`,
}

// decodeAnswerMembers is what Send did before answerMembers: the reference it must match.
func decodeAnswerMembers(data []byte) (usage, errRaw json.RawMessage, err error) {
	var top struct {
		Usage json.RawMessage `json:"usage"`
		Error json.RawMessage `json:"error"`
	}
	err = json.Unmarshal(data, &top)
	return top.Usage, top.Error, err
}

func requireAnswerMembersAsDecode(t *testing.T, data []byte) {
	t.Helper()
	if !startsObject(data) {
		return // Send refuses such an answer before it reads its members
	}
	wantUsage, wantErrRaw, wantErr := decodeAnswerMembers(data)
	usage, errRaw, err := answerMembers(data)
	if wantErr != nil {
		require.EqualError(t, err, wantErr.Error(), "%q", data)
		return
	}
	require.NoError(t, err, "%q", data)
	require.Equal(t, string(wantUsage), string(usage), "usage of %q", data)
	require.Equal(t, wantUsage == nil, usage == nil, "usage absent in %q", data)
	require.Equal(t, string(wantErrRaw), string(errRaw), "error of %q", data)
	require.Equal(t, wantErrRaw == nil, errRaw == nil, "error absent in %q", data)
}

func TestAnswerMembers_AsTheDecodeDid(t *testing.T) {
	t.Parallel()
	for _, data := range answerCases {
		requireAnswerMembersAsDecode(t, []byte(data))
	}
}

// FuzzAnswerMembers: as TestAnswerMembers_AsTheDecodeDid, on any answer.
func FuzzAnswerMembers(f *testing.F) {
	for _, data := range answerCases {
		f.Add([]byte(data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		requireAnswerMembersAsDecode(t, data)
	})
}

// TestAnswerMembers_ScansTheUsualAnswer pins that both providers' usual answers are walked, not
// decoded: no allocation (json.Unmarshal allocated for the two fields and its decoder state).
func TestAnswerMembers_ScansTheUsualAnswer(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	for _, data := range answerCases[:2] {
		_, _, ok := scanAnswer([]byte(data))
		require.True(t, ok, data)
		body := []byte(data)
		allocs := testing.AllocsPerRun(100, func() {
			if _, _, err := answerMembers(body); err != nil {
				panic(err)
			}
		})
		require.Zero(t, allocs, data)
		decodeAllocs := testing.AllocsPerRun(100, func() {
			if _, _, err := decodeAnswerMembers(body); err != nil {
				panic(err)
			}
		})
		require.NotZero(t, decodeAllocs, "the decode it replaces allocates: %s", data)
	}
}

// BenchmarkAnswerMembers: the walk of each answer for its usage and error, of both providers'
// usual answers (a paragraph of text).
func BenchmarkAnswerMembers(b *testing.B) {
	text := strings.Repeat("lorem ipsum dolor sit amet ", 20)
	for _, bc := range []struct{ name, body string }{
		{"Anthropic", `{"id":"msg_01","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"` + text +
			`"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"cache_creation_input_tokens":0,` +
			`"cache_read_input_tokens":0,"output_tokens":16,"service_tier":"standard"}}`},
		{"OpenAI", `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"gpt-x","choices":[{"index":0,` +
			`"message":{"role":"assistant","content":"` + text + `","refusal":null},"logprobs":null,"finish_reason":"stop"}],` +
			`"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16,"prompt_tokens_details":{"cached_tokens":0}},` +
			`"system_fingerprint":"fp_1"}`},
	} {
		body := []byte(bc.body)
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := answerMembers(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
