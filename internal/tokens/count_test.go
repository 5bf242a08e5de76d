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
			want: tokens.Request{Model: "claude-x", TextBytes: 8000, Input: 2000, MaxOutput: 200},
		},
		{
			// blocks are joined by a newline; non-text blocks count nothing; system counts
			name: "AnthropicBlocksAndSystem", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"abc"}],"messages":[
				{"role":"user","content":[{"type":"text","text":"hello"},{"type":"image","source":{}},{"type":"text","text":"world"}]},
				{"role":"assistant","content":"ok"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 3 + 11 + 2, Input: 4, MaxOutput: 5},
		},
		{
			name: "AnthropicSystemString", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":5,"system":"12345678","messages":[{"role":"user","content":"1234"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 12, Input: 3, MaxOutput: 5},
		},
		{
			// OpenAI's system prompt is a message; a top-level "system" is not its API
			name: "OpenAI", provider: tokens.ProviderOpenAI,
			body: `{"model":"gpt-x","max_tokens":100,"system":"ignored","messages":[{"role":"system","content":"12345678"},
				{"role":"user","content":[{"type":"text","text":"1234"}]},{"role":"assistant","content":null}]}`,
			want: tokens.Request{Model: "gpt-x", TextBytes: 12, Input: 3, MaxOutput: 100},
		},
		{
			name: "OpenAIMaxCompletionTokensWins", provider: tokens.ProviderOpenAI,
			body: `{"model":"o","max_tokens":100,"max_completion_tokens":300,"messages":[{"role":"user","content":"hi"}]}`,
			want: tokens.Request{Model: "o", TextBytes: 2, Input: 1, MaxOutput: 300},
		},
		{
			name: "DefaultMaxOutputAndAtLeastOneToken", provider: tokens.ProviderOpenAI,
			body: `{"model":"o","messages":[{"role":"user","content":""}]}`,
			want: tokens.Request{Model: "o", Input: 1, MaxOutput: tokens.DefaultMaxOutput},
		},
		{
			name: "UTF8Bytes", provider: tokens.ProviderAnthropic,
			body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"héllo wörld"}]}`,
			want: tokens.Request{Model: "m", TextBytes: 13, Input: 3, MaxOutput: 1},
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
