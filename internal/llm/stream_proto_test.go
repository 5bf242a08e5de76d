package llm_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// The Chat Completions API adds "obfuscation" (random padding, on by default) to every chunk: a
// field of the stream, which a non-streaming answer has not. The stored message is the
// non-streaming one, without it; the fields both forms have (system_fingerprint, service_tier)
// are kept.
func TestStream_OpenAIObfuscationNotStored(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-C42qMU7","object":"chat.completion.chunk","created":1755080278,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_34a54111"`
	b := setup(t, llm.KindOpenAI, sseHandler([]string{
		`data: {` + env + `,"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"AAatV4uAp"}`,
		`data: {` + env + `,"choices":[{"index":0,"delta":{"content":"Once"},"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"x9"}`,
		`data: {` + env + `,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null,"obfuscation":"Lq0s"}`,
		`data: {` + env + `,"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10},"obfuscation":"k"}`,
		`data: [DONE]`,
	}))
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	require.JSONEq(t, `{"id":"chatcmpl-C42qMU7","object":"chat.completion","created":1755080278,
		"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_34a54111",
		"choices":[{"index":0,"message":{"role":"assistant","content":"Once","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],
		"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}`, string(resp.Body))
}

// A client that sets stream_options for another reason (include_obfuscation: false, which OpenAI
// suggests to save bandwidth) still gets the usage asked for: without it the job's usage is zero,
// its stored message has "usage": null where a non-streaming answer has the counts, and the
// limiter cannot true up the call.
func TestStream_OpenAIStreamOptionsWithoutIncludeUsage(t *testing.T) {
	t.Parallel()
	p, _ := simProvider(t, llm.KindOpenAI, llmsim.Config{ReplyTokens: 5})
	whole, err := p.Send(t.Context(), bodyFor(llm.KindOpenAI), llm.SendOptions{})
	require.NoError(t, err)
	defer whole.Release()
	require.NotZero(t, whole.Usage)
	for _, opts := range []string{`{"include_obfuscation":false}`, `{}`, `null`, ` { } `} {
		t.Run(opts, func(t *testing.T) {
			var m map[string]json.RawMessage
			require.NoError(t, json.Unmarshal(streamBody(llm.KindOpenAI), &m))
			m["stream_options"] = json.RawMessage(opts)
			body, err := json.Marshal(m)
			require.NoError(t, err)
			resp, err := p.Send(t.Context(), body, llm.SendOptions{})
			require.NoError(t, err)
			defer resp.Release()
			require.Equal(t, whole.Usage, resp.Usage, "the usage a non-streaming call reports")
		})
	}

	t.Run("Sent", func(t *testing.T) {
		var mu sync.Mutex
		var sent []byte
		b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			sent, _ = io.ReadAll(r.Body)
			mu.Unlock()
			sseHandler([]string{`data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}`, `data: [DONE]`})(w, r)
		})
		for body, want := range map[string]string{
			` {"model":"g","stream":true,"stream_options": { "include_obfuscation":false } ,"n":1}`: ` {"model":"g","stream":true,"stream_options": {"include_usage":true, "include_obfuscation":false } ,"n":1}`,
			`{"stream_options":null,"model":"g","stream":true}`:                                     `{"stream_options":{"include_usage":true},"model":"g","stream":true}`,
			`{"model":"g","stream":true,"stream_options":{ }}`:                                      `{"model":"g","stream":true,"stream_options":{"include_usage":true}}`,
			`{"model":"g","stream":true,"stream_options":{"include_usage":false}}`:                  `{"model":"g","stream":true,"stream_options":{"include_usage":false}}`,
			`{"model":"g","stream":true,"stream_options":{"include_usage":null}}`:                   `{"model":"g","stream":true,"stream_options":{"include_usage":null}}`,
			`{"model":"g","stream":true,"stream_options":"yes"}`:                                    `{"model":"g","stream":true,"stream_options":"yes"}`,
		} {
			resp, err := b.provider.Send(t.Context(), []byte(body), llm.SendOptions{})
			require.NoError(t, err)
			resp.Release()
			mu.Lock()
			require.Equal(t, want, string(sent), "sent for %s", body)
			mu.Unlock()
		}
	})

	t.Run("KeptAsSent", func(t *testing.T) {
		var sent []byte
		b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, r *http.Request) {
			sent, _ = io.ReadAll(r.Body)
			sseHandler([]string{`data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}`, `data: [DONE]`})(w, r)
		})
		body := `{"model":"g","stream":true,"stream_options":{"include_usage":false,"include_obfuscation":false},"messages":[{"role":"user","content":"x"}]}`
		resp, err := b.provider.Send(t.Context(), []byte(body), llm.SendOptions{})
		require.NoError(t, err)
		resp.Release()
		require.Equal(t, body, string(sent), "an include_usage the client set is the client's")
	})
}

// An MCP connector's tool call (mcp_tool_use) streams its input as input_json_delta, as tool_use
// and server_tool_use do: the stored block has that input, as a non-streaming answer has it.
func TestStream_AnthropicMCPToolInputKept(t *testing.T) {
	t.Parallel()
	b := setup(t, llm.KindAnthropic, sseHandler([]string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"mcp_tool_use\",\"id\":\"mcptoolu_1\",\"name\":\"echo\",\"server_name\":\"example\",\"input\":{}}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"message\\\": \\\"hi\"}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"}\"}}",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"mcp_tool_result\",\"tool_use_id\":\"mcptoolu_1\",\"is_error\":false,\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}}",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":12}}",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}",
	}))
	var got deltas
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{OnDelta: got.add})
	require.NoError(t, err)
	defer resp.Release()
	require.Equal(t, `{"message": "hi"}`, got.text(llm.DeltaInputJSON))
	require.JSONEq(t, `{"id":"msg_1","type":"message","role":"assistant","model":"c","content":[
		{"type":"mcp_tool_use","id":"mcptoolu_1","name":"echo","server_name":"example","input":{"message":"hi"}},
		{"type":"mcp_tool_result","tool_use_id":"mcptoolu_1","is_error":false,"content":[{"type":"text","text":"hi"}]}],
		"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":12}}`, string(resp.Body))
}

// message_delta carries the top-level changes to the message: besides stop_reason and
// stop_sequence, the code execution tool's container (its id is what a follow-up request passes
// to reuse it) in delta, and context_management beside it. The stored message has them, as a
// non-streaming answer does.
func TestStream_AnthropicMessageDeltaFieldsKept(t *testing.T) {
	t.Parallel()
	b := setup(t, llm.KindAnthropic, sseHandler([]string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"container\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"done\"}}",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null,\"container\":{\"id\":\"container_011CPR5CNjB747bTd36fQLFk\",\"expires_at\":\"2025-05-23T21:13:31.749448Z\"}},\"context_management\":{\"applied_edits\":[]},\"usage\":{\"output_tokens\":7}}",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}",
	}))
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	require.JSONEq(t, `{"id":"msg_1","type":"message","role":"assistant","model":"c",
		"content":[{"type":"text","text":"done"}],"stop_reason":"end_turn","stop_sequence":null,
		"container":{"id":"container_011CPR5CNjB747bTd36fQLFk","expires_at":"2025-05-23T21:13:31.749448Z"},
		"context_management":{"applied_edits":[]},"usage":{"input_tokens":3,"output_tokens":7}}`, string(resp.Body))
}

// A request with the legacy "functions" is answered with delta.function_call pieces (the name on
// the first) and finish_reason "function_call": the stored message carries the call as a
// non-streaming answer does, and its arguments reach clients as input_json deltas.
func TestStream_OpenAILegacyFunctionCallKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-ApllfOJ8","object":"chat.completion.chunk","created":1736901711,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_72ed7ab54c"`
	b := setup(t, llm.KindOpenAI, sseHandler([]string{
		`data: {` + env + `,"choices":[{"index":0,"delta":{"role":"assistant","content":null,"function_call":{"name":"get_info","arguments":""},"refusal":null},"logprobs":null,"finish_reason":null}],"usage":null}`,
		`data: {` + env + `,"choices":[{"index":0,"delta":{"function_call":{"arguments":"{\""}},"logprobs":null,"finish_reason":null}],"usage":null}`,
		`data: {` + env + `,"choices":[{"index":0,"delta":{"function_call":{"arguments":"id\":7}"}},"logprobs":null,"finish_reason":null}],"usage":null}`,
		`data: {` + env + `,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"function_call"}],"usage":null}`,
		`data: {` + env + `,"choices":[],"usage":{"prompt_tokens":60,"completion_tokens":8,"total_tokens":68}}`,
		`data: [DONE]`,
	}))
	var got deltas
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: got.add})
	require.NoError(t, err)
	defer resp.Release()
	require.JSONEq(t, `{"id":"chatcmpl-ApllfOJ8","object":"chat.completion","created":1736901711,
		"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_72ed7ab54c",
		"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"annotations":[],
			"function_call":{"name":"get_info","arguments":"{\"id\":7}"}},"logprobs":null,"finish_reason":"function_call"}],
		"usage":{"prompt_tokens":60,"completion_tokens":8,"total_tokens":68}}`, string(resp.Body))
	require.Equal(t, `{"id":7}`, got.text(llm.DeltaInputJSON))
	require.Equal(t, "get_info", got.all[0].ToolName)
}

// Azure OpenAI (and gateways in front of it) open the stream with a prompt_filter_results chunk
// whose id, model and created are empty: the stored message has those of the answer's chunks, as a
// non-streaming answer does.
func TestStream_OpenAIEmptyFirstChunkFilled(t *testing.T) {
	t.Parallel()
	b := setup(t, llm.KindOpenAI, sseHandler([]string{
		`data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}}}]}`,
		`data: {"choices":[{"content_filter_results":{},"delta":{"content":"","refusal":null,"role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],"created":1750697159,"id":"chatcmpl-BleatwEUn3D8","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":null}`,
		`data: {"choices":[{"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}},"delta":{"content":"Hi"},"finish_reason":null,"index":0,"logprobs":null}],"created":1750697159,"id":"chatcmpl-BleatwEUn3D8","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":null}`,
		`data: {"choices":[{"content_filter_results":{},"delta":{},"finish_reason":"stop","index":0,"logprobs":null}],"created":1750697159,"id":"chatcmpl-BleatwEUn3D8","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":null}`,
		`data: {"choices":[],"created":1750697159,"id":"chatcmpl-BleatwEUn3D8","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0","usage":{"completion_tokens":2,"prompt_tokens":8,"total_tokens":10}}`,
		`data: [DONE]`,
	}))
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	var out map[string]any
	require.NoError(t, json.Unmarshal(resp.Body, &out))
	require.Equal(t, "chatcmpl-BleatwEUn3D8", out["id"], "body: %s", resp.Body)
	require.Equal(t, "gpt-4o-2024-08-06", out["model"])
	require.EqualValues(t, 1750697159, out["created"])
	require.Equal(t, "fp_ee1d74bde0", out["system_fingerprint"])
	require.Equal(t, "chat.completion", out["object"])
	require.NotNil(t, out["prompt_filter_results"], "Azure's non-streaming answer has it too")
	require.Equal(t, llm.Usage{InputTokens: 8, OutputTokens: 2}, resp.Usage)
}

// A tool call cut by max_tokens (or streamed without validation: eager_input_streaming) ends
// with input that is not JSON. It is the provider's answer all the same (stop_reason
// max_tokens), not one llmq failed to read: it is stored, the input wrapped as Anthropic's
// documentation says to pass invalid input back, {"INVALID_JSON": "<the text>"}.
func TestStream_AnthropicTruncatedToolInputKept(t *testing.T) {
	t.Parallel()
	b := setup(t, llm.KindAnthropic, sseHandler([]string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"make_file\",\"input\":{}}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"filename\\\": \\\"poem.txt\\\", \\\"lines_of_text\\\": [\\\"Roses\"}}",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":16}}",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}",
	}))
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	require.Equal(t, llm.Usage{InputTokens: 3, OutputTokens: 16}, resp.Usage)
	require.JSONEq(t, `{"id":"msg_1","type":"message","role":"assistant","model":"c","content":[
		{"type":"tool_use","id":"toolu_1","name":"make_file","input":{"INVALID_JSON":"{\"filename\": \"poem.txt\", \"lines_of_text\": [\"Roses"}}],
		"stop_reason":"max_tokens","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":16}}`, string(resp.Body))
}

// A stream's bytes are many times its answer's: each Chat Completions chunk repeats the envelope
// (id, model, fingerprint, obfuscation padding: ~300 bytes for a token of ~4). What a stream holds
// of the answer budget, and what counts against MaxResponseBytes, is what it keeps (the answer
// assembled so far, its line buffers), not every byte it read: an answer whose non-streaming body
// fits fits streamed, and a long stream does not hold the budget's room that others wait for.
func TestStream_HoldsWhatItKeeps(t *testing.T) {
	t.Parallel()
	const tokens = 3000 // ~900 KB of chunks for 12 KB of text
	env := `"id":"chatcmpl-C42qMU7","object":"chat.completion.chunk","created":1755080278,"model":"gpt-4o-mini-2024-07-18","service_tier":"default","system_fingerprint":"fp_34a54111"`
	pad := `"obfuscation":"` + strings.Repeat("x", 100) + `"`
	events := []string{`data: {` + env + `,"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},"logprobs":null,"finish_reason":null}],"usage":null,` + pad + `}`}
	for range tokens {
		events = append(events, `data: {`+env+`,"choices":[{"index":0,"delta":{"content":"abcd"},"logprobs":null,"finish_reason":null}],"usage":null,`+pad+`}`)
	}
	events = append(events,
		`data: {`+env+`,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null,`+pad+`}`,
		`data: {`+env+`,"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3000,"total_tokens":3009},`+pad+`}`,
		`data: [DONE]`)
	const maxBytes = 256 << 10 // the answer is 12 KB; its stream ~900 KB
	budget, err := llm.NewAnswerBudget(maxBytes+64<<10, maxBytes)
	require.NoError(t, err)
	b := setup(t, llm.KindOpenAI, sseHandler(events), bundleOpts{maxBytes: maxBytes, budget: budget})
	var most int64
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: func(llm.Delta) {
		most = max(most, budget.InUse())
	}})
	require.NoError(t, err, "the answer fits MaxResponseBytes")
	defer resp.Release()
	require.Equal(t, llm.Usage{InputTokens: 9, OutputTokens: 3000}, resp.Usage)
	require.Less(t, most, int64(128<<10), "held while streaming: the text kept and the buffers, not the %d bytes read", tokens*300)
	require.Equal(t, int64(cap(resp.Body)), budget.InUse(), "the answer holds its body once read")
}

// An answer that does not fit MaxResponseBytes still fails as too large when streamed.
func TestStream_AnswerOverTheLimitRefused(t *testing.T) {
	t.Parallel()
	const maxBytes = 64 << 10
	for _, kind := range []llm.Kind{llm.KindAnthropic, llm.KindOpenAI} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, kind, sseHandler(splitEvents(kind, strings.Repeat("abcdefgh", 12<<10), 1<<10)), bundleOpts{maxBytes: maxBytes})
			_, err := b.provider.Send(t.Context(), streamBody(kind), llm.SendOptions{})
			require.ErrorIs(t, err, llm.ErrResponseTooLarge)
		})
	}
}

// OpenAI-compatible servers that give their chunks no id (OpenVINO Model Server) or an empty one
// (text-generation-inference) hold what they keep too: the chunks after the first are not the
// message's top-level fields, whatever their id. (Counted as read, each chunk's envelope, the
// answer below failed as larger than the limit its body fits.) Their chunks as they write them:
// members in their order, TGI's delta with the role every time.
func TestStream_HoldsWhatItKeepsWithoutAnID(t *testing.T) {
	t.Parallel()
	const tokens = 3000
	pad := strings.Repeat("x", 100) // the rest of an envelope: ~250 bytes a chunk for 4 of text
	for name, chunk := range map[string]func(delta, finish, usage string) string{
		"NoID": func(delta, finish, usage string) string {
			return `{"choices":[{"delta":` + delta + `,"finish_reason":` + finish + `,"index":0,"logprobs":null}],"created":1755080278,"model":"OpenVINO/Qwen3-8B-int4-ov","object":"chat.completion.chunk","pad":"` + pad + `","usage":` + usage + `}`
		},
		"EmptyID": func(delta, finish, usage string) string {
			return `{"object":"chat.completion.chunk","id":"","created":1755080278,"model":"tgi","system_fingerprint":"3.0.1-sha-bb9095a","choices":[{"index":0,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + `}],"usage":` + usage + `,"pad":"` + pad + `"}`
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			events := []string{`data: ` + chunk(`{"role":"assistant","content":""}`, "null", "null")}
			for range tokens {
				events = append(events, `data: `+chunk(`{"role":"assistant","content":"abcd"}`, "null", "null"))
			}
			events = append(events,
				`data: `+chunk(`{"role":"assistant","content":""}`, `"stop"`, `{"prompt_tokens":9,"completion_tokens":3000,"total_tokens":3009}`),
				`data: [DONE]`)
			const maxBytes = 256 << 10 // the answer is 12 KB; its stream ~750 KB
			budget, err := llm.NewAnswerBudget(maxBytes+64<<10, maxBytes)
			require.NoError(t, err)
			b := setup(t, llm.KindOpenAI, sseHandler(events), bundleOpts{maxBytes: maxBytes, budget: budget})
			var most int64
			resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: func(llm.Delta) {
				most = max(most, budget.InUse())
			}})
			require.NoError(t, err, "the answer fits MaxResponseBytes")
			defer resp.Release()
			require.Less(t, most, int64(128<<10), "held while streaming: the text kept and the buffers")
			require.Equal(t, llm.Usage{InputTokens: 9, OutputTokens: 3000}, resp.Usage)
			var out struct {
				Model   string `json:"model"`
				Choices []struct {
					Message struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			}
			require.NoError(t, json.Unmarshal(resp.Body, &out))
			require.Len(t, out.Choices, 1)
			require.Equal(t, strings.Repeat("abcd", tokens), out.Choices[0].Message.Content)
			require.NotEmpty(t, out.Model)
		})
	}
}
