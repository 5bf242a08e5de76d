package tokens_test

import (
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
			// blocks are joined by a newline; non-text blocks count nothing; system counts
			name: "AnthropicBlocksAndSystem", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"abc"}],"messages":[
				{"role":"user","content":[{"type":"text","text":"hello"},{"type":"image","source":{}},{"type":"text","text":"world"}]},
				{"role":"assistant","content":"ok"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 3 + 11 + 2, Input: 4, Choices: 1, MaxOutput: 5},
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
// submit's token check sees them. Other blocks (images, documents) still count nothing.
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
		require.Equal(t, max(tc.want/tokens.BytesPerToken, 1), r.Input, tc.name)
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
