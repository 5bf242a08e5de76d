package llm_test

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
)

// Anthropic's prompt-caching counts are read, whole or streamed: message_start gives them, a
// message_delta may restate them (cumulative; a null keeps the count before). The input-token
// limit counts input_tokens and the cache's creation (LimitedInput); the whole prompt adds the
// cache's read (PromptInput).
func TestUsage_AnthropicPromptCache(t *testing.T) {
	t.Parallel()
	want := llm.Usage{InputTokens: 5, OutputTokens: 30, CacheCreationInputTokens: 600, CacheReadInputTokens: 70}

	t.Run("whole", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"c","content":[],`+
				`"stop_reason":"end_turn","usage":{"input_tokens":5,"cache_creation_input_tokens":600,`+
				`"cache_read_input_tokens":70,"cache_creation":{"ephemeral_5m_input_tokens":600,"ephemeral_1h_input_tokens":0},"output_tokens":30}}`)
		})
		resp, err := b.provider.Send(t.Context(), bodyFor(llm.KindAnthropic), llm.SendOptions{})
		require.NoError(t, err)
		require.Equal(t, want, resp.Usage)
		require.Equal(t, 605, resp.Usage.LimitedInput())
		require.Equal(t, 675, resp.Usage.PromptInput())
	})

	t.Run("streamed", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llm.KindAnthropic, sseHandler([]string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":600,\"cache_read_input_tokens\":70,\"output_tokens\":1}}}",
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":600,\"cache_read_input_tokens\":null,\"output_tokens\":30}}",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}",
		}))
		resp, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{})
		require.NoError(t, err)
		require.Equal(t, want, resp.Usage)
	})
}

// OpenAI's prompt_tokens include its cached tokens (prompt_tokens_details.cached_tokens), and its
// token limits count them: the input is prompt_tokens, nothing added.
func TestUsage_OpenAICachedTokensInPromptTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","model":"g","choices":[],`+
			`"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920}}}`)
	})
	resp, err := b.provider.Send(t.Context(), bodyFor(llm.KindOpenAI), llm.SendOptions{})
	require.NoError(t, err)
	require.Equal(t, llm.Usage{InputTokens: 2006, OutputTokens: 300}, resp.Usage)
	require.Equal(t, 2006, resp.Usage.LimitedInput())
	require.Equal(t, 2006, resp.Usage.PromptInput())
}

// A usage that reports no output count (a gateway's partial usage) is told from one reporting 0
// output tokens (an empty answer): OutputUnreported, whose output the executor keeps charged,
// where it refunds a reported 0. No usage at all is the zero Usage.
func TestUsage_OutputUnreported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		kind  llm.Kind
		usage string // "" sends none
		want  llm.Usage
	}{
		{"AnthropicNoOutput", llm.KindAnthropic, `{"input_tokens":500}`, llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"AnthropicZeroOutput", llm.KindAnthropic, `{"input_tokens":500,"output_tokens":0}`, llm.Usage{InputTokens: 500}},
		{"AnthropicNoUsage", llm.KindAnthropic, "", llm.Usage{}},
		{"OpenAINoOutput", llm.KindOpenAI, `{"prompt_tokens":500}`, llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"OpenAIZeroOutput", llm.KindOpenAI, `{"prompt_tokens":500,"completion_tokens":0}`, llm.Usage{InputTokens: 500}},
		{"OpenAINoUsage", llm.KindOpenAI, "", llm.Usage{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			usage := ""
			if tc.usage != "" {
				usage = `,"usage":` + tc.usage
			}
			b := setup(t, tc.kind, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if tc.kind == llm.KindAnthropic {
					_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"c","content":[],`+
						`"stop_reason":"end_turn"`+usage+`}`)
					return
				}
				_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","model":"g","choices":[]`+usage+`}`)
			})
			resp, err := b.provider.Send(t.Context(), bodyFor(tc.kind), llm.SendOptions{})
			require.NoError(t, err)
			require.Equal(t, tc.want, resp.Usage)
		})
	}
}
