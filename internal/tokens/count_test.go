package tokens_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/tokens"
)

func TestCount(t *testing.T) {
	t.Parallel()
	text := strings.Repeat("x", 8000) // 2,000 tokens
	for _, tc := range []struct {
		name     string
		provider string
		body     string
		want     tokens.Request
	}{
		{
			name: "AnthropicString", provider: tokens.ProviderAnthropic,
			body: `{"model":"claude-x","max_tokens":200,"messages":[{"role":"user","content":"` + text + `"}]}`,
			want: tokens.Request{Model: "claude-x", TextBytes: 8000, Input: 2000, Choices: 1, MaxOutput: 200},
		},
		{
			// blocks are joined by a newline; an image of no source counts the most an image
			// costs (TestCount_ImageDefaults), not text; system counts
			name: "AnthropicBlocksAndSystem", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"abc"}],"messages":[
				{"role":"user","content":[{"type":"text","text":"hello"},{"type":"image","source":{}},{"type":"text","text":"world"}]},
				{"role":"assistant","content":"ok"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 3 + 11 + 2, Input: 4 + tokens.AnthropicMaxImageTokens,
				ImageTokens: tokens.AnthropicMaxImageTokens, UnknownImageTokens: tokens.AnthropicMaxImageTokens,
				Choices: 1, MaxOutput: 5},
		},
		{
			name: "AnthropicSystemString", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":5,"system":"12345678","messages":[{"role":"user","content":"1234"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 12, Input: 3, Choices: 1, MaxOutput: 5},
		},
		{
			// OpenAI's system prompt is a message; a top-level "system" is not its API
			name: "OpenAI", provider: tokens.ProviderOpenAI,
			body: `{"model":"gpt-x","max_tokens":100,"system":"ignored","messages":[{"role":"system","content":"12345678"},
				{"role":"user","content":[{"type":"text","text":"1234"}]},{"role":"assistant","content":null}]}`,
			want: tokens.Request{Model: "gpt-x", TextBytes: 12, Input: 3, Choices: 1, MaxOutput: 100},
		},
		{
			// a developer message is the newer models' system prompt: any role's content counts; an
			// image_url that is not a base64 image counts the most an image costs
			name: "OpenAIDeveloperRoleAndParts", provider: tokens.ProviderOpenAI,
			body: `{"model":"o","messages":[{"role":"developer","content":[{"type":"text","text":"12345678"}]},
				{"role":"user","content":[{"type":"text","text":"1234"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`,
			want: tokens.Request{Model: "o", TextBytes: 12, Input: 3 + tokens.OpenAIMaxImageTokens, ImageTokens: tokens.OpenAIMaxImageTokens,
				UnknownImageTokens: tokens.OpenAIMaxImageTokens, Choices: 1, MaxOutput: tokens.DefaultMaxOutput, AssumedOutput: true},
		},
		{
			name: "OpenAIMaxCompletionTokensWins", provider: tokens.ProviderOpenAI,
			body: `{"model":"o","max_tokens":100,"max_completion_tokens":300,"messages":[{"role":"user","content":"hi"}]}`,
			want: tokens.Request{Model: "o", TextBytes: 2, Input: 1, Choices: 1, MaxOutput: 300},
		},
		{
			name: "DefaultMaxOutputAndAtLeastOneToken", provider: tokens.ProviderOpenAI,
			body: `{"model":"o","messages":[{"role":"user","content":""}]}`,
			want: tokens.Request{Model: "o", Input: 1, Choices: 1, MaxOutput: tokens.DefaultMaxOutput, AssumedOutput: true},
		},
		{
			name: "UTF8Bytes", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"héllo wörld"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 13, Input: 3, Choices: 1, MaxOutput: 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tokens.Count(tc.provider, []byte(tc.body))
			require.NoError(t, err)
			tc.want.MinInput = max(tc.want.Input-tc.want.UnknownImageTokens, 1) // images of unknown size may be small
			require.Equal(t, tc.want, got)
		})
	}

	t.Run("Errors", func(t *testing.T) {
		t.Parallel()
		for body, want := range map[string]string{
			`[1]`:                          "body is not a JSON object",
			`not json`:                     "body is not a JSON object",
			`{"messages":{"role":"user"}}`: "messages is not an array of messages",
			`{"messages":[1]}`:             "messages is not an array of messages",
			`{"messages":[{"role":"user","content":42}]}`: "messages.0.content: must be a string or an array of content blocks",
			`{"system":42,"messages":[]}`:                 "system: must be a string or an array of content blocks",
			`{"max_tokens":0,"messages":[]}`:              "max_tokens must be a positive integer",
			`{"max_tokens":"many","messages":[]}`:         "max_tokens must be a positive integer",
			`{"max_tokens":1.5,"messages":[]}`:            "max_tokens must be a positive integer",
		} {
			_, err := tokens.Count(tokens.ProviderAnthropic, []byte(body))
			require.ErrorIs(t, err, tokens.ErrInvalidRequest, body)
			require.ErrorContains(t, err, want, body)
		}
		_, err := tokens.Count("gemini", []byte(`{}`))
		require.ErrorContains(t, err, "unknown provider")
	})
}

// TestCount_IntegralNumbers: the providers read 4096.0 as the integer 4096 (their JSON Schema's
// "integer"); Count reads it so too, rather than failing the count and reserving nothing.
func TestCount_IntegralNumbers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		provider, body string
		want           int
	}{
		{tokens.ProviderAnthropic, `{"max_tokens":4096.0,"messages":[]}`, 4096},
		{tokens.ProviderAnthropic, `{"max_tokens":4.096e3,"messages":[]}`, 4096},
		{tokens.ProviderAnthropic, `{"max_tokens":1E0,"messages":[]}`, 1},
		{tokens.ProviderOpenAI, `{"max_tokens":100,"max_completion_tokens":300.00,"messages":[]}`, 300},
		{tokens.ProviderOpenAI, `{"max_tokens":2147483647.0,"messages":[]}`, 2147483647},
	} {
		r, err := tokens.Count(tc.provider, []byte(tc.body))
		require.NoError(t, err, tc.body)
		require.Equal(t, tc.want, r.MaxOutput, tc.body)
	}
	for _, body := range []string{
		`{"max_tokens":4096.5,"messages":[]}`, `{"max_tokens":"4096","messages":[]}`, `{"max_tokens":0.0,"messages":[]}`,
		`{"max_tokens":-1.0,"messages":[]}`, `{"max_tokens":2147483648.0,"messages":[]}`, `{"max_tokens":1e400,"messages":[]}`,
		`{"max_tokens":true,"messages":[]}`,
	} {
		_, err := tokens.Count(tokens.ProviderAnthropic, []byte(body))
		require.ErrorIs(t, err, tokens.ErrInvalidRequest, body)
		require.ErrorContains(t, err, "max_tokens must be a positive integer", body)
	}
}

// TestCount_Choices: OpenAI's n asks for n choices, each up to the output allowance, and the
// answer's usage counts them all: the output reserved is the allowance times n.
func TestCount_Choices(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		provider, body      string
		choices, wantOutput int
	}{
		{tokens.ProviderOpenAI, `{"max_tokens":100,"messages":[]}`, 1, 100},
		{tokens.ProviderOpenAI, `{"max_tokens":100,"n":null,"messages":[]}`, 1, 100},
		{tokens.ProviderOpenAI, `{"max_tokens":100,"n":1,"messages":[]}`, 1, 100},
		{tokens.ProviderOpenAI, `{"max_completion_tokens":100,"n":3,"messages":[]}`, 3, 300},
		{tokens.ProviderOpenAI, `{"n":3.0,"messages":[]}`, 3, 3 * tokens.DefaultMaxOutput},
		{tokens.ProviderOpenAI, `{"max_tokens":2147483647,"n":128,"messages":[]}`, 128, 2147483647 * 128},
		// Anthropic has no n: the field is not its API, and counts nothing.
		{tokens.ProviderAnthropic, `{"max_tokens":100,"n":3,"messages":[]}`, 1, 100},
		{tokens.ProviderAnthropic, `{"max_tokens":100,"n":"x","messages":[]}`, 1, 100},
	} {
		r, err := tokens.Count(tc.provider, []byte(tc.body))
		require.NoError(t, err, tc.body)
		require.Equal(t, tc.choices, r.Choices, tc.body)
		require.Equal(t, tc.wantOutput, r.MaxOutput, tc.body)
	}
	for _, n := range []string{`0`, `-1`, `129`, `1.5`, `"3"`, `true`, `[3]`, `1e400`} {
		body := `{"max_tokens":100,"n":` + n + `,"messages":[]}`
		_, err := tokens.Count(tokens.ProviderOpenAI, []byte(body))
		require.ErrorIs(t, err, tokens.ErrInvalidChoices, body)
		require.ErrorIs(t, err, tokens.ErrInvalidRequest, body)
		require.ErrorContains(t, err, "n must be an integer from 1 to 128", body)
	}
}

// TestCount_ToolsAndToolResults: a tool's definition and a tool's result are text the provider
// reads as input (an agent's prompt is mostly tool results): the rule counts the tools' JSON as
// sent and a tool_result block's content as text, so that the limiter reserves them and the
// submit's token check sees them. An image in a result counts as an image (TestCount_Images), not
// as text.
func TestCount_ToolsAndToolResults(t *testing.T) {
	t.Parallel()
	result := strings.Repeat("r", 8000)
	tools := `[{"name":"search","description":"` + strings.Repeat("d", 400) + `","input_schema":{"type":"object"}}]`
	for _, tc := range []struct {
		name, provider, body string
		want                 int
	}{
		{"AnthropicResultString", tokens.ProviderAnthropic,
			`{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"` + result + `"}]}]}`,
			8000},
		{"AnthropicResultBlocks", tokens.ProviderAnthropic,
			`{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"abc"},
				{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"12345"},{"type":"image","source":{}},{"type":"text","text":"678"}]}]}]}`,
			3 + 1 + 5 + 1 + 3},
		{"AnthropicTools", tokens.ProviderAnthropic,
			`{"max_tokens":5,"tools":` + tools + `,"messages":[{"role":"user","content":"1234"}]}`,
			len(tools) + 4},
		{"OpenAITools", tokens.ProviderOpenAI,
			`{"max_tokens":5,"tools":` + tools + `,"messages":[{"role":"user","content":"1234"}]}`,
			len(tools) + 4},
		{"NullTools", tokens.ProviderOpenAI, `{"tools":null,"messages":[{"role":"user","content":"1234"}]}`, 4},
	} {
		r, err := tokens.Count(tc.provider, []byte(tc.body))
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, r.TextBytes, tc.name)
		require.Equal(t, max(tc.want/tokens.BytesPerToken, 1)+r.ImageTokens, r.Input, tc.name)
	}
}

// TestCount_ToolsWhiteSpaceCountsNothing: the tools' JSON counts as compact JSON, whatever white
// space the client laid it out with: an indented schema is the same definitions to the provider,
// and Input is the least a request's input can be (a request is refused as too large on it).
func TestCount_ToolsWhiteSpaceCountsNothing(t *testing.T) {
	t.Parallel()
	compact := `[{"name":"f","description":"a \"b\"\n c\\","input_schema":{"type":"object","properties":{"q":{"type":"string"}}}}]`
	indented := "[\n  {\n    \"name\": \"f\",\n    \"description\": \"a \\\"b\\\"\\n c\\\\\",\n    \"input_schema\": {\r\n\t\"type\": \"object\",\n" +
		"      \"properties\": {\n        \"q\": { \"type\": \"string\" }\n      }\n    }\n  }\n]"
	for _, provider := range []string{tokens.ProviderAnthropic, tokens.ProviderOpenAI} {
		want, err := tokens.Count(provider, []byte(`{"max_tokens":5,"tools":`+compact+`,"messages":[{"role":"user","content":"1234"}]}`))
		require.NoError(t, err)
		require.Equal(t, len(compact)+4, want.TextBytes, provider)
		got, err := tokens.Count(provider, []byte(`{"max_tokens":5,"tools": `+indented+` ,"messages":[{"role":"user","content":"1234"}]}`))
		require.NoError(t, err)
		require.Equal(t, want.TextBytes, got.TextBytes, provider)
	}
}

// TestCount_ToolCallsAndDocuments: an assistant turn's tool calls (Anthropic's tool_use input,
// OpenAI's tool_calls arguments) and a document's text (an Anthropic document block whose source
// is text, or content blocks) are input the provider charges: an agent that writes files sends
// each file back in its own tool calls, and a document can be the whole prompt. The rule counts
// them; a base64 or URL document still counts nothing, and an image no text (TestCount_Images).
func TestCount_ToolCallsAndDocuments(t *testing.T) {
	t.Parallel()
	file := strings.Repeat("f", 4000)
	input := `{"path":"a.go","text":"` + file + `"}`
	args := `{\"path\":\"a.go\",\"text\":\"` + file + `\"}` // the arguments are a JSON string
	for _, tc := range []struct {
		name, provider, body string
		want                 int
	}{
		{"AnthropicToolUse", tokens.ProviderAnthropic,
			`{"max_tokens":5,"messages":[{"role":"user","content":"go"},
				{"role":"assistant","content":[{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"write","input": ` + input + `}]}]}`,
			2 + 2 + 1 + len(input)},
		{"AnthropicToolUseLayout", tokens.ProviderAnthropic,
			`{"max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"w","input":{ "a" : [ 1, 2 ] }}]}]}`,
			len(`{"a":[1,2]}`)},
		{"OpenAIToolCalls", tokens.ProviderOpenAI,
			`{"messages":[{"role":"user","content":"go"},{"role":"assistant","content":null,"tool_calls":[
				{"id":"c1","type":"function","function":{"name":"write","arguments":"` + args + `"}},
				{"id":"c2","type":"function","function":{"name":"read","arguments":"{}"}}]},
				{"role":"tool","tool_call_id":"c1","content":"done"}]}`,
			2 + len("write") + len(input) + len("read") + 2 + 4},
		{"AnthropicTextDocument", tokens.ProviderAnthropic,
			`{"max_tokens":5,"messages":[{"role":"user","content":[
				{"type":"document","source":{"type":"text","media_type":"text/plain","data":"` + file + `\n"}},
				{"type":"text","text":"sum up"}]}]}`,
			len(file) + 1 + 1 + 6},
		{"AnthropicContentDocument", tokens.ProviderAnthropic,
			`{"max_tokens":5,"messages":[{"role":"user","content":[
				{"type":"document","source":{"type":"content","content":[{"type":"text","text":"` + file + `"},{"type":"text","text":"ab"}]}}]}]}`,
			len(file) + 1 + 2},
		{"AnthropicBase64DocumentCountsNothing", tokens.ProviderAnthropic,
			`{"max_tokens":5,"messages":[{"role":"user","content":[
				{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + file + `"}},
				{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + file + `"}},
				{"type":"text","text":"1234"}]}]}`,
			4},
	} {
		r, err := tokens.Count(tc.provider, []byte(tc.body))
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, r.TextBytes, tc.name)
	}
}

// TestCount_DocumentTextEscapes: a text document's data counts the bytes it decodes to, escapes
// included, as its text would.
func TestCount_DocumentTextEscapes(t *testing.T) {
	t.Parallel()
	for _, data := range []string{`plain`, `a\"\\\/\b\f\n\r\t`, `\u00e9\u20AC\ud83d\ude00`, `x\ud83d`, `\udc00y`, `\ud83d\u0041`, ``,
		"not \xffUTF-8\xe2\x82", "\xc3\xa9\xf0\x9f\x98\x80\\n\xed\xa0\x80"} {
		var want string
		require.NoError(t, json.Unmarshal([]byte(`"`+data+`"`), &want))
		r, err := tokens.Count(tokens.ProviderAnthropic, []byte(`{"max_tokens":5,"messages":[{"role":"user","content":[
			{"type":"document","source":{"type":"text","media_type":"text/plain","data":"`+data+`"}}]}]}`))
		require.NoError(t, err, data)
		require.Equal(t, len(want), r.TextBytes, data)
	}
}

// TestCount_ResponseFormatSchema: an OpenAI request's structured-output schema
// (response_format.json_schema) reaches the model as its tool definitions do, and is charged as
// input: the rule counts its JSON without white space, as the tools'. Anthropic has no such field.
func TestCount_ResponseFormatSchema(t *testing.T) {
	t.Parallel()
	schema := `{"name":"answer","strict":true,"schema":{"type":"object","properties":{"summary":{"type":"string","description":"` +
		strings.Repeat("s", 400) + `"}}}}`
	body := `{"max_tokens":5,"response_format":{"type":"json_schema","json_schema": ` + schema + ` },"messages":[{"role":"user","content":"1234"}]}`
	r, err := tokens.Count(tokens.ProviderOpenAI, []byte(body))
	require.NoError(t, err)
	require.Equal(t, len(schema)+4, r.TextBytes)

	r, err = tokens.Count(tokens.ProviderOpenAI, []byte(`{"response_format":{"type":"json_object"},"messages":[{"role":"user","content":"1234"}]}`))
	require.NoError(t, err)
	require.Equal(t, 4, r.TextBytes)

	r, err = tokens.Count(tokens.ProviderAnthropic, []byte(body))
	require.NoError(t, err)
	require.Equal(t, 4, r.TextBytes, "not Anthropic's API")

	_, err = tokens.Count(tokens.ProviderOpenAI, []byte(`{"response_format":"json","messages":[]}`))
	require.ErrorIs(t, err, tokens.ErrInvalidRequest)
	require.ErrorContains(t, err, "response_format: must be an object")
}

// TestCount_StringsAsDecoded: a string content, system and model are read without decoding them
// (Count's allocations), and still count what json.Unmarshal decodes them to: escapes, surrogates,
// bytes that are not UTF-8 (each the 3-byte replacement character), multibyte characters.
func TestCount_StringsAsDecoded(t *testing.T) {
	t.Parallel()
	for _, text := range []string{`plain`, `a\"\\\/\b\f\n\r\t`, `\u00e9\u20AC\ud83d\ude00`, `x\ud83d`, `\udc00y`, `\ud83d\u0041`, ``,
		"not \xffUTF-8\xe2\x82", "\xc3\xa9\xf0\x9f\x98\x80\\n\xed\xa0\x80", "\xef\xbf\xbd\x80"} {
		var want string
		require.NoError(t, json.Unmarshal([]byte(`"`+text+`"`), &want))
		for _, provider := range []string{tokens.ProviderAnthropic, tokens.ProviderOpenAI} {
			r, err := tokens.Count(provider, []byte(`{"model":"`+text+`","max_tokens":5,"system":"`+text+`",`+
				`"messages":[{"role":"user","content":"`+text+`"}]}`))
			require.NoError(t, err, text)
			require.Equal(t, want, r.Model, text)
			system := 0
			if provider == tokens.ProviderAnthropic {
				system = len(want)
			}
			require.Equal(t, len(want)+system, r.TextBytes, text)
		}
	}
	for _, body := range []string{`{"model":7,"messages":[]}`, `{"model":["m"],"messages":[]}`, `{"model":{"a":"b"},"messages":[]}`} {
		r, err := tokens.Count(tokens.ProviderAnthropic, []byte(body))
		require.NoError(t, err, body)
		require.Empty(t, r.Model, body)
	}
}

// TestCount_PlainIntegers: a max_tokens of plain digits is read without json's reflection, with
// the same limits: up to 2^31-1, and not 0.
func TestCount_PlainIntegers(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]int{
		`{"max_tokens":1,"messages":[]}`: 1, `{"max_tokens":2147483647,"messages":[]}`: 2147483647,
		`{"max_tokens": 16 ,"messages":[]}`: 16,
	} {
		r, err := tokens.Count(tokens.ProviderAnthropic, []byte(body))
		require.NoError(t, err, body)
		require.Equal(t, want, r.MaxOutput, body)
	}
	for _, body := range []string{`{"max_tokens":0,"messages":[]}`, `{"max_tokens":2147483648,"messages":[]}`,
		`{"max_tokens":123456789012345678,"messages":[]}`, `{"max_tokens":99999999999999999999,"messages":[]}`,
		`{"max_tokens":-5,"messages":[]}`} {
		_, err := tokens.Count(tokens.ProviderAnthropic, []byte(body))
		require.ErrorContains(t, err, "max_tokens must be a positive integer", body)
	}
}

// TestCount_Allocs pins the allocations of counting a small chat request, which the API makes at
// submit and the worker at every admission: the model's string and the messages' list. 20 when
// json.Unmarshal decoded the body, and the content, model and max_tokens each again; 3 while
// the fields the walk reads into were moved to the heap for json.Unmarshal's fallback.
func TestCount_Allocs(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops json.Valid's scanner at random: allocations vary")
	}
	body := []byte(`{"model":"claude-bench","max_tokens":16,"messages":[{"role":"user","content":"bench request 7"}]}`)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := tokens.Count(tokens.ProviderAnthropic, body); err != nil {
			panic(err)
		}
	})
	t.Logf("Count: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 2.0)
}
