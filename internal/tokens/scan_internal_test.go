package tokens

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jsonscan"
)

// scanCases are bodies scanBody reads and some it leaves to json.Unmarshal; Count must read each
// as it reads it with json.Unmarshal.
var scanCases = []string{
	`{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"bench request 7"}]}`,
	` { "model" : "m" , "max_tokens" : 16 , "messages" : [ { "content" : "a b" } , null , { } ] } `,
	`{"model":"m","system":[{"type":"text","text":"abc"}],"messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image","source":{}}]}]}`,
	`{"model":"m","tools":[{"name":"t","input_schema":{"type":"object"}}],"messages":[{"role":"assistant","content":null,` +
		`"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}],"n":3,"max_completion_tokens":7,` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}}`,
	// Repeated keys: the last value wins.
	`{"model":"a","model":"b","max_tokens":5,"max_tokens":9,"messages":[{"content":"x","content":"yy"}]}`,
	`{"max_tokens":null,"n":null,"model":null,"system":null,"tools":null,"messages":null}`,
	`{"messages":[]}`, `{}`, `{"other":{"messages":"x"},"list":[1,"]",{"a":"}"}],"esc":"\"}\\"}`,
	// Left to json.Unmarshal: keys it matches case-insensitively or through escapes, messages
	// given twice or not an array of objects, bodies not an object.
	`{"Model":"m","MESSAGES":[{"Content":"abc"}]}`, `{"m\u006fdel":"m","messages":[]}`, `{"max_Tokens":5,"messages":[]}`,
	`{"messages":[{"content":"a","tool_calls":[{"function":{"name":"f","arguments":"x"}}]}],"messages":[{"content":"b"}]}`,
	`{"messages":"x"}`, `{"messages":[1]}`, `{"messages":["a"]}`, `{"messages":{"content":"a"}}`, `{"messages":[[]]}`,
	`null`, `[]`, `"body"`, `7`, ``, `{`, `{"messages":[}`, `{"model":"m"}x`, `{"a":1,}`,
	// Malformed where scanBody reads (before, json.Valid refused them for it), at its end too.
	`{"model":"m",}`, `{"model" "m"}`, `{"model":}`, `{"model":"m"`, `{"model":"m" `, `{"model`, `{"`, `{"model":"m"}}`,
	`{"messages":[{"content":"a"},]}`, `{"messages":[{"content":"a"} {"content":"b"}]}`, `{"messages":[{"content":"a"}`,
	`{"messages":[{"content":"a",}]}`, `{"messages":[{"content":}]}`, `{"messages":[nul]}`, `{"messages":nulll}`,
	`{"messages":[null`, `{"messages":[{"content":"a"}]`, `{"messages":[{"content":"a\x"}]}`, "{\"model\":\"a\x01\"}",
	`{"max_tokens":01,"messages":[]}`, `{"max_tokens":1.,"messages":[]}`, `{"tools":[1,]}`, `{"system":tru}`,
	`{"messages":[{"content":"a","content":[{"type":"text","text":"b"}]}],"n":2}`, `{"model":"m"} {}`,
	// Values Count refuses, read from either.
	`{"max_tokens":"5","messages":[]}`, `{"n":0,"messages":[]}`, `{"messages":[{"content":5}]}`, `{"response_format":"x"}`,
	`{"messages":[{"content":"a","tool_calls":"x"}]}`, `{"system":7,"messages":[]}`,
}

// TestCount_ScanAsJSON: Count reads every body as it does with json.Unmarshal, which it used
// for every body before scanBody (issue 23).
func TestCount_ScanAsJSON(t *testing.T) {
	t.Parallel()
	for _, data := range scanCases {
		requireScanAsJSON(t, []byte(data))
	}
	deep := strings.Repeat("[", jsonscan.MaxDepth+1) + strings.Repeat("]", jsonscan.MaxDepth+1)
	for _, data := range []string{`{"tools":` + deep + `,"messages":[{"content":"abc"}]}`, `{"tools":` + deep + `}x`} {
		var b fields
		require.False(t, scanBody([]byte(data), &b), "nested deeper than jsonscan.MaxDepth: json.Unmarshal reads it")
		requireScanAsJSON(t, []byte(data))
	}
}

// FuzzCount_ScanAsJSON: any body counts alike read by scanBody or by json.Unmarshal.
func FuzzCount_ScanAsJSON(f *testing.F) {
	for _, data := range scanCases {
		f.Add([]byte(data))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		requireScanAsJSON(t, data)
	})
}

func requireScanAsJSON(t *testing.T, data []byte) {
	t.Helper()
	for _, provider := range []string{ProviderAnthropic, ProviderOpenAI} {
		want, wantErr := count(provider, data, false)
		got, err := count(provider, data, true)
		require.Equal(t, want, got, "%s %q", provider, data)
		if wantErr == nil {
			require.NoError(t, err, "%s %q", provider, data)
		} else {
			require.EqualError(t, err, wantErr.Error(), "%s %q", provider, data)
		}
	}
	var b fields
	if scanBody(data, &b) { // no panic on any data
		require.True(t, json.Valid(data), "scanBody read %q, which is not JSON", data)
	}
}
