package llm_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
)

// openAIChunks returns the events of a Chat Completions stream whose chunks have the envelope
// env and the choices given, then data: [DONE].
func openAIChunks(env string, choices ...string) []string {
	events := make([]string, 0, len(choices)+1)
	for _, c := range choices {
		events = append(events, `data: {`+env+`,"choices":`+c+`}`)
	}
	return append(events, `data: [DONE]`)
}

// streamedBody returns the message stored from a stream of events, as the provider of kind
// assembles it.
func streamedBody(t *testing.T, kind llm.Kind, events []string) string {
	t.Helper()
	b := setup(t, kind, sseHandler(events))
	resp, err := b.provider.Send(t.Context(), streamBody(kind), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	return string(resp.Body)
}

// azureSafe is Azure's content_filter_results members for text its filter rates safe, but
// violence.
const azureSafe = `"hate":{"filtered":false,"severity":"safe"},"self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"}`

// OpenAI-compatible servers stream a reasoning model's chain of thought beside the answer:
// delta.reasoning_content (DeepSeek, SGLang, older vLLM, Qwen) or delta.reasoning (OpenRouter,
// Ollama, vLLM since its rename; vLLM sent both for a while). The stored message carries each
// under its own name, as their non-streaming answers do, and clients get the reasoning as thinking
// deltas once, which add up to it.
func TestStream_OpenAIReasoningKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"0f3c","object":"chat.completion.chunk","created":1738000000,"model":"deepseek-reasoner","system_fingerprint":"fp_7e0991cad4"`
	for name, tc := range map[string]struct {
		events []string
		want   string
		choice string // members of the choice beside index, message, logprobs and finish_reason
	}{
		"DeepSeek": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":""},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":null,"reasoning_content":"The user"},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":null,"reasoning_content":" greets."},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"Hello","reasoning_content":null},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"!","reasoning_content":null},"logprobs":null,"finish_reason":"stop"}]`),
			want: `"reasoning_content":"The user greets."`,
		},
		"OpenRouter": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"The user"},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]`,
				`[{"index":0,"delta":{"role":"assistant","content":"","reasoning":" greets."},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]`,
				`[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]`,
				`[{"index":0,"delta":{"role":"assistant","content":"!"},"finish_reason":"stop","native_finish_reason":"stop","logprobs":null}]`),
			want:   `"reasoning":"The user greets."`,
			choice: `,"native_finish_reason":"stop"`,
		},
		"Both": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"reasoning":"The user","reasoning_content":"The user"},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"reasoning":" greets.","reasoning_content":" greets."},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop"}]`),
			want: `"reasoning":"The user greets.","reasoning_content":"The user greets."`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, llm.KindOpenAI, sseHandler(tc.events))
			var got deltas
			resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: got.add})
			require.NoError(t, err)
			defer resp.Release()
			require.JSONEq(t, `{"id":"0f3c","object":"chat.completion","created":1738000000,
				"model":"deepseek-reasoner","system_fingerprint":"fp_7e0991cad4",
				"choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","refusal":null,
					"annotations":[],`+tc.want+`},"logprobs":null,"finish_reason":"stop"`+tc.choice+`}],
				"usage":null}`, string(resp.Body))
			require.Equal(t, "The user greets.", got.text(llm.DeltaThinking), "once, adding up to the stored text")
			require.Equal(t, "Hello!", got.text(llm.DeltaText))
		})
	}
}

// A server with a reasoning parser sends the reasoning member on every delta, null when the
// model did not reason (SGLang: "reasoning_content":null beside the content; vLLM since its
// rename: "reasoning":null), and its non-streaming answer has the member null: the stored message
// has it null too. A server that never sends the member has none.
func TestStream_OpenAINullReasoningKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"a1b2","object":"chat.completion.chunk","created":1738000000,"model":"qwen3-8b"`
	for name, tc := range map[string]struct {
		events []string
		want   string
	}{
		"ReasoningContentNull": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"role":null,"content":"Hello","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"role":null,"content":"!","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop"}]`),
			want: `,"reasoning_content":null,"tool_calls":null`,
		},
		"ReasoningNull": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"Hello","reasoning":null},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"!","reasoning":null},"logprobs":null,"finish_reason":"stop"}]`),
			want: `,"reasoning":null`,
		},
		"NullThenText": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":null,"reasoning_content":"Hm."},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"Hello!","reasoning_content":null},"logprobs":null,"finish_reason":"stop"}]`),
			want: `,"reasoning_content":"Hm."`,
		},
		"NeverSent": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":"stop"}]`),
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.JSONEq(t, `{"id":"a1b2","object":"chat.completion","created":1738000000,"model":"qwen3-8b",
				"choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","refusal":null,
					"annotations":[]`+tc.want+`},"logprobs":null,"finish_reason":"stop"}],
				"usage":null}`, streamedBody(t, llm.KindOpenAI, tc.events))
		})
	}
}

// Web search models (gpt-4o-search-preview) stream their url_citation annotations in
// delta.annotations, on an annotations-only chunk after the text; every non-streaming message has
// "annotations" ([] when none). The stored message has them all, in order.
func TestStream_OpenAIAnnotationsKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-BRx","object":"chat.completion.chunk","created":1745000000,"model":"gpt-4o-search-preview-2025-03-11","system_fingerprint":""`
	const cite1 = `{"type":"url_citation","url_citation":{"end_index":54,"start_index":0,"title":"Paris weather","url":"https://example.com/paris?utm_source=openai"}}`
	const cite2 = `{"type":"url_citation","url_citation":{"end_index":90,"start_index":55,"title":"Forecast","url":"https://example.org/f?utm_source=openai"}}`
	b := setup(t, llm.KindOpenAI, sseHandler(openAIChunks(env,
		`[{"index":0,"delta":{"role":"assistant","content":"","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":null}]`,
		`[{"index":0,"delta":{"content":"Sunny in Paris."},"logprobs":null,"finish_reason":null}]`,
		`[{"index":0,"delta":{"annotations":[`+cite1+`]},"logprobs":null,"finish_reason":null}]`,
		`[{"index":0,"delta":{"annotations":[`+cite2+`]},"logprobs":null,"finish_reason":null}]`,
		`[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]`)))
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	require.JSONEq(t, `{"id":"chatcmpl-BRx","object":"chat.completion","created":1745000000,
		"model":"gpt-4o-search-preview-2025-03-11","system_fingerprint":"",
		"choices":[{"index":0,"message":{"role":"assistant","content":"Sunny in Paris.","refusal":null,
			"annotations":[`+cite1+`,`+cite2+`]},"logprobs":null,"finish_reason":"stop"}],
		"usage":null}`, string(resp.Body))
}

// GPT-5's custom tools (free-form input) are called with tool_calls of type "custom", whose
// pieces are custom.name and custom.input: the stored call is the non-streaming one,
// {"id","type":"custom","custom":{"name","input"}}, and its input reaches clients as input_json
// deltas, the name and id on the first.
func TestStream_OpenAICustomToolCallKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-C5","object":"chat.completion.chunk","created":1755000000,"model":"gpt-5-2025-08-07","service_tier":"default","system_fingerprint":null`
	b := setup(t, llm.KindOpenAI, sseHandler(openAIChunks(env,
		`[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_9","type":"custom","custom":{"name":"code_exec","input":""}}],"refusal":null},"finish_reason":null}]`,
		`[{"index":0,"delta":{"tool_calls":[{"index":0,"custom":{"input":"print("}}]},"finish_reason":null}]`,
		`[{"index":0,"delta":{"tool_calls":[{"index":0,"custom":{"input":"\"hi\")"}}]},"finish_reason":null}]`,
		`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`)))
	var got deltas
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: got.add})
	require.NoError(t, err)
	defer resp.Release()
	require.JSONEq(t, `{"id":"chatcmpl-C5","object":"chat.completion","created":1755000000,
		"model":"gpt-5-2025-08-07","service_tier":"default","system_fingerprint":null,
		"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"annotations":[],
			"tool_calls":[{"id":"call_9","type":"custom","custom":{"name":"code_exec","input":"print(\"hi\")"}}]},
			"logprobs":null,"finish_reason":"tool_calls"}],
		"usage":null}`, string(resp.Body))
	require.Equal(t, `print("hi")`, got.text(llm.DeltaInputJSON))
	require.Equal(t, "code_exec", got.all[0].ToolName)
	require.Equal(t, "call_9", got.all[0].ToolID)
}

// Azure OpenAI rates each choice's content (hate, self_harm, sexual, violence, protected
// material) as its content filter passes it, in the chunks' content_filter_results; a
// non-streaming choice carries them as one object. The stored choice has every category, each at
// its most severe report (a filtered or detected one, or the highest severity), so that a segment
// rated safe after one rated medium does not hide it.
func TestStream_AzureContentFilterResultsKept(t *testing.T) {
	t.Parallel()
	const tail = `"created":1750697159,"id":"chatcmpl-Bl","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_ee1d74bde0"`
	chunk := func(choices string) string { return `data: {"choices":` + choices + `,` + tail + `}` }
	const safe = azureSafe
	b := setup(t, llm.KindOpenAI, sseHandler([]string{
		`data: {"choices":[],"created":0,"id":"","model":"","object":"","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}`,
		chunk(`[{"content_filter_results":{},"delta":{"content":"","refusal":null,"role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}]`),
		chunk(`[{"content_filter_results":{` + safe + `,"violence":{"filtered":false,"severity":"medium"}},"delta":{"content":"The duel"},"finish_reason":null,"index":0,"logprobs":null}]`),
		chunk(`[{"content_filter_results":{` + safe + `,"violence":{"filtered":false,"severity":"low"},"protected_material_text":{"filtered":false,"detected":false}},"delta":{"content":" ended."},"finish_reason":null,"index":0,"logprobs":null}]`),
		chunk(`[{"content_filter_results":{},"delta":{},"finish_reason":"stop","index":0,"logprobs":null}]`),
		`data: [DONE]`,
	}))
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	require.JSONEq(t, `{"created":1750697159,"id":"chatcmpl-Bl","model":"gpt-4o-2024-08-06","object":"chat.completion",
		"system_fingerprint":"fp_ee1d74bde0","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}],
		"choices":[{"index":0,"message":{"role":"assistant","content":"The duel ended.","refusal":null,"annotations":[]},
			"content_filter_results":{`+safe+`,"violence":{"filtered":false,"severity":"medium"},
				"protected_material_text":{"filtered":false,"detected":false}},
			"logprobs":null,"finish_reason":"stop"}],
		"usage":null}`, string(resp.Body))
}

// With Azure's Asynchronous Filter the content streams unfiltered and the filter's ratings follow in
// annotation chunks (empty id and model, no delta) whose choice has content_filter_offsets beside
// the content_filter_results: where in the streamed text the rated segment starts and ends, and up
// to where all of it was checked. A non-streaming choice has no offsets (its results rate the whole
// text), and the stored results are every segment's merged (each category at its most severe),
// which the last segment's offsets would misdescribe: the stored choice has the results, not the
// offsets.
func TestStream_AzureAsyncFilterOffsetsNotKept(t *testing.T) {
	t.Parallel()
	const tail = `"created":1751000792,"id":"chatcmpl-Bm","model":"gpt-4o-2024-08-06","object":"chat.completion.chunk","system_fingerprint":"fp_07871e2ad8"`
	const annotationTail = `"created":0,"id":"","model":"","object":""`
	const safe = azureSafe
	body := streamedBody(t, llm.KindOpenAI, []string{
		`data: {"choices":[],` + annotationTail + `,"prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}`,
		`data: {"choices":[{"content_filter_results":{},"delta":{"content":"","refusal":null,"role":"assistant"},"finish_reason":null,"index":0,"logprobs":null}],` + tail + `}`,
		`data: {"choices":[{"delta":{"content":"The duel"},"finish_reason":null,"index":0,"logprobs":null}],` + tail + `}`,
		`data: {"choices":[{"delta":{"content":" ended."},"finish_reason":null,"index":0,"logprobs":null}],` + tail + `}`,
		`data: {"choices":[{"delta":{},"finish_reason":"stop","index":0,"logprobs":null}],` + tail + `}`,
		`data: {"choices":[{"content_filter_offsets":{"check_offset":0,"start_offset":0,"end_offset":8},"content_filter_results":{` + safe + `,"violence":{"filtered":false,"severity":"medium"}},"finish_reason":null,"index":0}],` + annotationTail + `}`,
		`data: {"choices":[{"content_filter_offsets":{"check_offset":8,"start_offset":8,"end_offset":15},"content_filter_results":{` + safe + `,"violence":{"filtered":false,"severity":"safe"}},"finish_reason":null,"index":0}],` + annotationTail + `}`,
		`data: [DONE]`,
	})
	require.JSONEq(t, `{"created":1751000792,"id":"chatcmpl-Bm","model":"gpt-4o-2024-08-06","object":"chat.completion",
		"system_fingerprint":"fp_07871e2ad8","prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}],
		"choices":[{"index":0,"message":{"role":"assistant","content":"The duel ended.","refusal":null,"annotations":[]},
			"content_filter_results":{`+safe+`,"violence":{"filtered":false,"severity":"medium"}},
			"logprobs":null,"finish_reason":"stop"}],
		"usage":null}`, body)
}

// Some OpenAI-compatible servers repeat a tool call's id and name on every chunk of its
// arguments (OpenAI sends them on the first only): the stored name is the tool's, not the pieces
// concatenated ("get_weatherget_weather..."), and only the first delta carries the id and name,
// as the API documents, so that the deltas after it merge as OpenAI's do. A legacy function_call
// whose name is repeated is kept the same way.
func TestStream_OpenAIRepeatedToolNameNotDoubled(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-7","object":"chat.completion.chunk","created":1750000000,"model":"qwen3"`
	t.Run("ToolCalls", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llm.KindOpenAI, sseHandler(openAIChunks(env,
			`[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]`,
			`[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":"}}]},"finish_reason":null}]`,
			`[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"\"Paris\"}"}}]},"finish_reason":null}]`,
			`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`)))
		var got deltas
		resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: got.add})
		require.NoError(t, err)
		defer resp.Release()
		require.JSONEq(t, `{"id":"chatcmpl-7","object":"chat.completion","created":1750000000,"model":"qwen3",
			"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"annotations":[],
				"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
				"logprobs":null,"finish_reason":"tool_calls"}],
			"usage":null}`, string(resp.Body))
		require.Equal(t, []llm.Delta{
			{Type: llm.DeltaInputJSON, ToolID: "call_1", ToolName: "get_weather"},
			{Type: llm.DeltaInputJSON, Text: `{"city":`},
			{Type: llm.DeltaInputJSON, Text: `"Paris"}`},
		}, got.all)
	})

	t.Run("FunctionCall", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llm.KindOpenAI, sseHandler(openAIChunks(env,
			`[{"index":0,"delta":{"role":"assistant","content":null,"function_call":{"name":"get_info","arguments":""}},"finish_reason":null}]`,
			`[{"index":0,"delta":{"function_call":{"name":"get_info","arguments":"{\"id\":7}"}},"finish_reason":null}]`,
			`[{"index":0,"delta":{},"finish_reason":"function_call"}]`)))
		var got deltas
		resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: got.add})
		require.NoError(t, err)
		defer resp.Release()
		require.Contains(t, string(resp.Body), `"function_call":{"arguments":"{\"id\":7}","name":"get_info"}`)
		require.Equal(t, []llm.Delta{
			{Type: llm.DeltaInputJSON, ToolName: "get_info"},
			{Type: llm.DeltaInputJSON, Text: `{"id":7}`},
		}, got.all)
	})
}

// Some gateways send reasoning as an object ({"text":...}: Envoy AI Gateway's Bedrock reasoning)
// or annotations in a form that is not an array: members the assembler ignored before it
// assembled them. Such a chunk must not fail the stream (a decode error fails the job): its text
// and the rest of the answer are kept, the member it cannot read is left out.
func TestStream_OpenAIUnreadableReasoningIgnored(t *testing.T) {
	t.Parallel()
	const env = `"id":"c1","object":"chat.completion.chunk","created":1758000000,"model":"claude-via-gw"`
	b := setup(t, llm.KindOpenAI, sseHandler(openAIChunks(env,
		`[{"index":0,"delta":{"content":"","role":"assistant"}}]`,
		`[{"index":0,"delta":{"role":"assistant","reasoning_content":{"text":"I nee"}}}]`,
		`[{"index":0,"delta":{"role":"assistant","reasoning":[{"text":"d to"}]}}]`,
		`[{"index":0,"delta":{"content":"12231","annotations":{"type":"none"}}}]`,
		`[{"index":0,"delta":{},"finish_reason":"stop"}]`)))
	var got deltas
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: got.add})
	require.NoError(t, err)
	defer resp.Release()
	require.JSONEq(t, `{"id":"c1","object":"chat.completion","created":1758000000,"model":"claude-via-gw",
		"choices":[{"index":0,"message":{"role":"assistant","content":"12231","refusal":null,"annotations":[]},
			"logprobs":null,"finish_reason":"stop"}],
		"usage":null}`, string(resp.Body))
	require.Equal(t, "12231", got.text(llm.DeltaText))
}

// sendOpenAIStream sends a streaming request to a server that answers events, and returns the
// assembled response (released at the test's end) and the deltas handed on.
func sendOpenAIStream(t *testing.T, events []string) (*llm.Response, *deltas) {
	t.Helper()
	b := setup(t, llm.KindOpenAI, sseHandler(events))
	got := &deltas{}
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: got.add})
	require.NoError(t, err)
	t.Cleanup(resp.Release)
	return resp, got
}

// requireToolCallsStreamed sends events as an OpenAI stream and requires the stored message's
// tool_calls to be want (JSON) and the deltas clients got to be wantDeltas.
func requireToolCallsStreamed(t *testing.T, events []string, want string, wantDeltas []llm.Delta) {
	t.Helper()
	resp, got := sendOpenAIStream(t, events)
	require.JSONEq(t, want, storedToolCalls(t, resp.Body))
	require.Equal(t, wantDeltas, got.all)
}

// requireToolCallsAt sends events and requires the stored tool calls to be want, and the
// deltas to reach clients at the tool indexes pos, in order.
func requireToolCallsAt(t *testing.T, events []string, want string, pos []int) {
	t.Helper()
	resp, got := sendOpenAIStream(t, events)
	require.JSONEq(t, want, storedToolCalls(t, resp.Body))
	var at []int
	for _, d := range got.all {
		at = append(at, d.ToolIndex)
	}
	require.Equal(t, pos, at)
}

// Gemini's compatible endpoint sends parallel tool calls without "index": each chunk (or each
// entry of one chunk's tool_calls) is a whole call with its own id. Each is stored as its own
// call, in order, and reaches clients under its own tool index; a piece without index and
// without id continues the call before it.
func TestStream_GeminiUnindexedParallelToolCallsKept(t *testing.T) {
	t.Parallel()
	const env = `"created":1758000000,"id":"Zr8","model":"gemini-2.5-flash","object":"chat.completion.chunk"`
	const want = `{"created":1758000000,"id":"Zr8","model":"gemini-2.5-flash","object":"chat.completion",
		"choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"annotations":[],
			"tool_calls":[
				{"id":"function-call-1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
				{"id":"function-call-2","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]},
			"logprobs":null,"finish_reason":"tool_calls"}],
		"usage":null}`
	for name, events := range map[string][]string{
		"ChunkPerCall": openAIChunks(env,
			`[{"delta":{"role":"assistant","tool_calls":[{"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},"id":"function-call-1","type":"function"}]},"index":0}]`,
			`[{"delta":{"role":"assistant","tool_calls":[{"function":{"arguments":"{\"tz\":\"CET\"}","name":"get_time"},"id":"function-call-2","type":"function"}]},"index":0}]`,
			`[{"delta":{"role":"assistant"},"finish_reason":"tool_calls","index":0}]`),
		"CallsInOneChunk": openAIChunks(env,
			`[{"delta":{"role":"assistant","tool_calls":[{"function":{"arguments":"{\"city\":\"Paris\"}","name":"get_weather"},"id":"function-call-1","type":"function"},{"function":{"arguments":"{\"tz\":\"CET\"}","name":"get_time"},"id":"function-call-2","type":"function"}]},"finish_reason":"tool_calls","index":0}]`),
		"ArgumentsContinued": openAIChunks(env,
			`[{"delta":{"role":"assistant","tool_calls":[{"function":{"arguments":"{\"city\":","name":"get_weather"},"id":"function-call-1","type":"function"}]},"index":0}]`,
			`[{"delta":{"tool_calls":[{"function":{"arguments":"\"Paris\"}"}}]},"index":0}]`,
			`[{"delta":{"tool_calls":[{"function":{"arguments":"{\"tz\":","name":"get_time"},"id":"function-call-2","type":"function"}]},"index":0}]`,
			`[{"delta":{"tool_calls":[{"function":{"arguments":"\"CET\"}"}}]},"index":0}]`,
			`[{"delta":{},"finish_reason":"tool_calls","index":0}]`),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resp, got := sendOpenAIStream(t, events)
			require.JSONEq(t, want, string(resp.Body))
			byTool := map[int]string{}
			var firsts []llm.Delta
			for _, d := range got.all {
				byTool[d.ToolIndex] += d.Text
				if d.ToolID != "" {
					firsts = append(firsts, llm.Delta{ToolIndex: d.ToolIndex, ToolID: d.ToolID, ToolName: d.ToolName})
				}
			}
			require.Equal(t, map[int]string{0: `{"city":"Paris"}`, 1: `{"tz":"CET"}`}, byTool)
			require.Equal(t, []llm.Delta{
				{ToolIndex: 0, ToolID: "function-call-1", ToolName: "get_weather"},
				{ToolIndex: 1, ToolID: "function-call-2", ToolName: "get_time"},
			}, firsts)
		})
	}
}

// A server that repeats a call's name on a chunk that carries neither its id nor arguments (a
// name-only chunk between the first and the arguments) has it stored once, and clients get the
// name once; a name cut into pieces still joins.
func TestStream_OpenAINameOnlyRepeatNotDoubled(t *testing.T) {
	t.Parallel()
	const env = `"id":"c3","object":"chat.completion.chunk","created":1758000000,"model":"llama"`
	for name, tc := range map[string]struct {
		events     []string
		want       string
		wantDeltas []llm.Delta
	}{
		"Repeated": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"get_weather"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want: `"function":{"arguments":"{}","name":"get_weather"}`,
			wantDeltas: []llm.Delta{
				{Type: llm.DeltaInputJSON, ToolID: "call_1", ToolName: "get_weather"},
				{Type: llm.DeltaInputJSON, Text: `{}`},
			},
		},
		"Pieces": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"edit_ex"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"isting_file"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"name":"edit_existing_file","arguments":"{}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want: `"function":{"arguments":"{}","name":"edit_existing_file"}`,
			wantDeltas: []llm.Delta{
				{Type: llm.DeltaInputJSON, ToolID: "call_1", ToolName: "edit_ex"},
				{Type: llm.DeltaInputJSON, ToolName: "isting_file"},
				{Type: llm.DeltaInputJSON, Text: `{}`},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resp, got := sendOpenAIStream(t, tc.events)
			require.Contains(t, string(resp.Body), tc.want)
			require.Equal(t, tc.wantDeltas, got.all)
		})
	}
}

// OpenRouter streams reasoning_details beside reasoning: objects with type (reasoning.text,
// reasoning.summary, reasoning.encrypted), their text, summary or data in pieces, and index,
// format, id, signature; the pieces of one index make one entry, as in its non-streaming message.
// Its choices carry native_finish_reason, the upstream provider's, kept in the stored choice.
func TestStream_OpenRouterReasoningDetailsKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"gen-17","provider":"Anthropic","model":"anthropic/claude-sonnet-4","object":"chat.completion.chunk","created":1758000000`
	resp, got := sendOpenAIStream(t, openAIChunks(env,
		`[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"The user","reasoning_details":[{"type":"reasoning.text","text":"The user","signature":null,"format":"anthropic-claude-v1","index":0}]},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]`,
		`[{"index":0,"delta":{"role":"assistant","content":"","reasoning":" greets.","reasoning_details":[{"type":"reasoning.text","text":" greets.","signature":null,"format":"anthropic-claude-v1","index":0}]},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]`,
		`[{"index":0,"delta":{"role":"assistant","content":"","reasoning":"","reasoning_details":[{"type":"reasoning.text","text":"","signature":"EqMB","format":"anthropic-claude-v1","index":0}]},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]`,
		`[{"index":0,"delta":{"role":"assistant","content":"","reasoning_details":[{"type":"reasoning.encrypted","data":"gAAA","format":"anthropic-claude-v1","index":1}]},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]`,
		`[{"index":0,"delta":{"role":"assistant","content":"Hello!"},"finish_reason":null,"native_finish_reason":null,"logprobs":null}]`,
		`[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop","native_finish_reason":"end_turn","logprobs":null}]`))
	require.JSONEq(t, `{"id":"gen-17","provider":"Anthropic","model":"anthropic/claude-sonnet-4",
		"object":"chat.completion","created":1758000000,
		"choices":[{"index":0,"message":{"role":"assistant","content":"Hello!","refusal":null,"annotations":[],
			"reasoning":"The user greets.",
			"reasoning_details":[
				{"type":"reasoning.text","text":"The user greets.","signature":"EqMB","format":"anthropic-claude-v1","index":0},
				{"type":"reasoning.encrypted","data":"gAAA","format":"anthropic-claude-v1","index":1}]},
			"logprobs":null,"finish_reason":"stop","native_finish_reason":"end_turn"}],
		"usage":null}`, string(resp.Body))
	require.Equal(t, "The user greets.", got.text(llm.DeltaThinking), "once, adding up to the stored text")
}

// A server that sends only reasoning_details (no reasoning member) has its reasoning reach
// clients as thinking deltas all the same.
func TestStream_OpenAIReasoningDetailsAloneAreThinking(t *testing.T) {
	t.Parallel()
	const env = `"id":"gen-18","model":"m","object":"chat.completion.chunk","created":1758000000`
	resp, got := sendOpenAIStream(t, openAIChunks(env,
		`[{"index":0,"delta":{"role":"assistant","reasoning_details":[{"type":"reasoning.summary","summary":"Plan","index":0}]}}]`,
		`[{"index":0,"delta":{"reasoning_details":[{"type":"reasoning.summary","summary":"ning.","index":0}]}}]`,
		`[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]`))
	require.Contains(t, string(resp.Body), `"reasoning_details":[{"index":0,"summary":"Planning.","type":"reasoning.summary"}]`)
	require.Equal(t, "Planning.", got.text(llm.DeltaThinking))
}

// A custom tool call or content_filter_results of a type the assembler does not expect (a
// gateway's string, an array) is left out, as an unreadable reasoning member is: the chunk's other
// members are kept, and the stream does not fail.
func TestStream_OpenAIUnreadableCustomAndFiltersIgnored(t *testing.T) {
	t.Parallel()
	const env = `"id":"c4","object":"chat.completion.chunk","created":1758000000,"model":"gw"`
	resp, got := sendOpenAIStream(t, openAIChunks(env,
		`[{"index":0,"delta":{"role":"assistant","content":"Hi","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"},"custom":"none"}]},"content_filter_results":[]}]`,
		`[{"index":0,"delta":{"content":" there"},"content_filter_results":"safe"}]`,
		`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`))
	require.JSONEq(t, `{"id":"c4","object":"chat.completion","created":1758000000,"model":"gw",
		"choices":[{"index":0,"message":{"role":"assistant","content":"Hi there","refusal":null,"annotations":[],
			"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},
			"logprobs":null,"finish_reason":"tool_calls"}],
		"usage":null}`, string(resp.Body))
	require.Equal(t, "Hi there", got.text(llm.DeltaText))
}

// anthropicEvents returns the events of a Messages API stream: each [2]string an event's name and
// its data.
func anthropicEvents(events ...[2]string) []string {
	out := make([]string, 0, len(events))
	for _, e := range events {
		out = append(out, "event: "+e[0]+"\ndata: "+e[1])
	}
	return out
}

// With the web search tool, Claude's search is a server_tool_use block whose input streams as
// input_json_delta (its content_block_start has no input), the results a web_search_tool_result
// block that comes whole in its content_block_start, and the answer's text blocks cite them in
// citations_delta events. The stored message is the non-streaming one: the server_tool_use with
// its input, the result as it came, the citations in their text block's citations, a text block
// without any without the member.
func TestStream_AnthropicWebSearchKept(t *testing.T) {
	t.Parallel()
	const result = `{"type":"web_search_tool_result","tool_use_id":"srvtoolu_014hJH82Qum7Td6UV8gDXThB","content":[{"type":"web_search_result","title":"Claude Shannon - Wikipedia","url":"https://en.wikipedia.org/wiki/Claude_Shannon","encrypted_content":"EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgxNC1kNjNjNTk1ZWI3Y","page_age":"April 30, 2025"}]}`
	const citation = `{"type":"web_search_result_location","cited_text":"Claude Elwood Shannon (April 30, 1916 – February 24, 2001) was an American mathematician","url":"https://en.wikipedia.org/wiki/Claude_Shannon","title":"Claude Shannon - Wikipedia","encrypted_index":"Eo8BCioIAhgBIiQyYjQ0OWJmZi1lNm"}`
	body := streamedBody(t, llm.KindAnthropic, anthropicEvents(
		[2]string{"message_start", `{"type":"message_start","message":{"id":"msg_01G","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":2679,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":3}}}`},
		[2]string{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"I'll search for when Claude Shannon was born."}}`},
		[2]string{"content_block_stop", `{"type":"content_block_stop","index":0}`},
		[2]string{"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"server_tool_use","id":"srvtoolu_014hJH82Qum7Td6UV8gDXThB","name":"web_search"}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"claude"}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":" shannon birth date\"}"}}`},
		[2]string{"content_block_stop", `{"type":"content_block_stop","index":1}`},
		[2]string{"content_block_start", `{"type":"content_block_start","index":2,"content_block":` + result + `}`},
		[2]string{"content_block_stop", `{"type":"content_block_stop","index":2}`},
		[2]string{"content_block_start", `{"type":"content_block_start","index":3,"content_block":{"type":"text","text":""}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":3,"delta":{"type":"citations_delta","citation":` + citation + `}}`},
		[2]string{"content_block_delta", `{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"Claude Shannon was born on April 30, 1916."}}`},
		[2]string{"content_block_stop", `{"type":"content_block_stop","index":3}`},
		[2]string{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":10000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":105,"server_tool_use":{"web_search_requests":1}}}`},
		[2]string{"message_stop", `{"type":"message_stop"}`},
	))
	require.JSONEq(t, `{"id":"msg_01G","type":"message","role":"assistant","model":"claude-sonnet-4-5-20250929",
		"content":[
			{"type":"text","text":"I'll search for when Claude Shannon was born."},
			{"type":"server_tool_use","id":"srvtoolu_014hJH82Qum7Td6UV8gDXThB","name":"web_search",
				"input":{"query":"claude shannon birth date"}},
			`+result+`,
			{"type":"text","text":"Claude Shannon was born on April 30, 1916.","citations":[`+citation+`]}],
		"stop_reason":"end_turn","stop_sequence":null,
		"usage":{"input_tokens":10000,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,
			"output_tokens":105,"server_tool_use":{"web_search_requests":1}}}`, body)
}

// Anthropic-compatible servers (proxies that translate an OpenAI-format answer) send a tool
// call's input whole in its content_block_start and no input_json_delta, where Anthropic sends
// "input":{} and the input in deltas. The stored block has the input the stream gave: the deltas'
// when any brought some (they replace the start's, as the SDKs read them), the start's otherwise.
// Clients get it as the stored block has it: the start's input reaches them as an input_json
// delta (its JSON text, compacted as stored) at the block's end, when no delta can replace it, so
// that the block's input_json deltas always add up to its stored input; Anthropic's own {} adds
// no delta.
func TestStream_AnthropicToolInputInBlockStartKept(t *testing.T) {
	t.Parallel()
	const start = `{"type":"message_start","message":{"id":"msg_9","type":"message","role":"assistant","model":"qwen3:8b","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":0}}}`
	const stop = `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":18}}`
	const blockStop = `{"type":"content_block_stop","index":0}`
	for name, tc := range map[string]struct {
		events [][2]string
		want   string // the stored input
		deltas string // the text of the block's input_json deltas
	}{
		"WholeInStart": {
			events: [][2]string{
				{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"call_k2","name":"get_weather","input":{"city": "Paris", "days": [1, 2]}}}`},
				{"content_block_stop", blockStop},
			},
			want:   `{"city":"Paris","days":[1,2]}`,
			deltas: `{"city":"Paris","days":[1,2]}`,
		},
		"WholeInStartThenBlankDeltas": { // empty or blank deltas bring no input: the start's stands
			events: [][2]string{
				{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"call_k2","name":"get_weather","input":{"city":"Paris"}}}`},
				{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`},
				{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":" "}}`},
				{"content_block_stop", blockStop},
			},
			want:   `{"city":"Paris"}`,
			deltas: ` {"city":"Paris"}`,
		},
		"WholeInStartNeverStopped": {
			events: [][2]string{
				{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"server_tool_use","id":"srv_1","name":"web_search","input":{"query":"llmq"}}}`},
			},
			want:   `{"query":"llmq"}`,
			deltas: `{"query":"llmq"}`,
		},
		"DeltasReplaceStart": {
			events: [][2]string{
				{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"call_k2","name":"get_weather","input":{"city":"Par"}}}`},
				{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\":"}}`},
				{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"\"Paris\"}"}}`},
				{"content_block_stop", blockStop},
			},
			want:   `{"city":"Paris"}`,
			deltas: `{"city":"Paris"}`,
		},
		"EmptyInput": {
			events: [][2]string{
				{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"now","input":{}}}`},
				{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":""}}`},
				{"content_block_stop", blockStop},
			},
			want: `{}`,
		},
		"NullInput": { // stored as {}, as a start without input: no delta
			events: [][2]string{
				{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"now","input":null}}`},
				{"content_block_stop", blockStop},
			},
			want: `{}`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			events := append(append([][2]string{{"message_start", start}}, tc.events...),
				[2]string{"message_delta", stop}, [2]string{"message_stop", `{"type":"message_stop"}`})
			b := setup(t, llm.KindAnthropic, sseHandler(anthropicEvents(events...)))
			got := &deltas{}
			resp, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{OnDelta: got.add})
			require.NoError(t, err)
			t.Cleanup(resp.Release)
			var msg struct {
				Content []struct {
					Input json.RawMessage `json:"input"`
				} `json:"content"`
			}
			require.NoError(t, json.Unmarshal(resp.Body, &msg))
			require.Len(t, msg.Content, 1)
			require.Equal(t, tc.want, string(msg.Content[0].Input))
			require.Equal(t, tc.deltas, got.text(llm.DeltaInputJSON), "the deltas add up to the stored input")
			require.NotEmpty(t, got.all)
			require.NotEmpty(t, got.all[0].ToolID, "the call's first delta names it, before its input")
		})
	}
}

// sglangHello is SGLang's stream of "Hello!" (Qwen3 with a reasoning parser, no tool called):
// reasoning_content, tool_calls and matched_stop on every chunk, null but the last matched_stop,
// the end-of-sequence token's id.
var sglangHello = openAIChunks(`"id":"5c1e","object":"chat.completion.chunk","created":1738000000,"model":"qwen3-8b"`,
	`[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}]`,
	`[{"index":0,"delta":{"role":null,"content":"Hello!","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}]`,
	`[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"stop","matched_stop":151645}]`)

// streamedChoice returns the members of the only choice of the message stored from a Chat
// Completions stream of events.
func streamedChoice(t *testing.T, events []string) map[string]json.RawMessage {
	t.Helper()
	var msg struct {
		Choices []map[string]json.RawMessage `json:"choices"`
	}
	require.NoError(t, json.Unmarshal([]byte(streamedBody(t, llm.KindOpenAI, events)), &msg))
	require.Len(t, msg.Choices, 1)
	return msg.Choices[0]
}

// SGLang sends "tool_calls":null on every delta of an answer without tool calls, and its
// non-streaming message has "tool_calls":null: the stored message has it null too. A server that
// never sends the member has none; tool calls that came are stored as they came, whatever nulls
// came around them. Pieces that bring no call anything (no id, name nor arguments), or an empty
// list, are no tool call: the member is null or left out as if they had not come, not an empty
// list (which the API refuses in an assistant message sent back).
func TestStream_OpenAINullToolCallsKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"5c1e","object":"chat.completion.chunk","created":1738000000,"model":"qwen3-8b"`
	for name, tc := range map[string]struct {
		events []string
		want   string
	}{
		"NullOnly": {
			events: sglangHello,
			want:   `,"content":"Hello!","reasoning_content":null,"tool_calls":null`,
		},
		"NullAroundCalls": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}]`,
				`[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":"call_0","index":0,"type":"function","function":{"name":"get_weather","arguments":""}}]},"logprobs":null,"finish_reason":null,"matched_stop":null}]`,
				`[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":null,"index":0,"type":"function","function":{"name":null,"arguments":"{\"city\": \"Paris\"}"}}]},"logprobs":null,"finish_reason":null,"matched_stop":null}]`,
				`[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"tool_calls","matched_stop":null}]`),
			want: `,"content":"","reasoning_content":null,"tool_calls":[{"id":"call_0","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]`,
		},
		"NeverSent": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":"stop"}]`),
			want: `,"content":"Hello!"`,
		},
		"NullAroundPieceThatBringsNothing": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"Hello!","reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}]`,
				`[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":"","index":0,"type":"function","function":{"name":"","arguments":""}}]},"logprobs":null,"finish_reason":"stop","matched_stop":null}]`),
			want: `,"content":"Hello!","reasoning_content":null,"tool_calls":null`,
		},
		"PieceThatBringsNothing": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"Hello!","tool_calls":[{"index":0,"type":"function"}]},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":""}}]},"logprobs":null,"finish_reason":"stop"}]`),
			want: `,"content":"Hello!"`,
		},
		"EmptyList": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"Hello!","tool_calls":[]},"logprobs":null,"finish_reason":"stop"}]`),
			want: `,"content":"Hello!"`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.JSONEq(t, `{"role":"assistant","refusal":null,"annotations":[]`+tc.want+`}`,
				string(streamedChoice(t, tc.events)["message"]))
		})
	}
}

// Servers add members of their own to a streamed choice, which their non-streaming choice has too:
// SGLang's matched_stop (null on every chunk, the stop token or string on the last), vLLM's
// stop_reason (on the last chunk only). The stored choice has each at its last non-null value,
// null when only null came. A list member is a piece per chunk (vLLM's token_ids with
// return_token_ids), whose last piece is not the list the non-streaming choice has: not kept.
func TestStream_OpenAIChoiceExtrasKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-9f","object":"chat.completion.chunk","created":1738000000,"model":"qwen3-8b"`
	for name, tc := range map[string]struct {
		events []string
		want   string
	}{
		"SGLangMatchedStop": {
			events: sglangHello,
			want:   `,"matched_stop":151645`,
		},
		"SGLangMatchedStopNull": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"Hello!"},"logprobs":null,"finish_reason":null,"matched_stop":null}]`,
				`[{"index":0,"delta":{"content":null},"logprobs":null,"finish_reason":"stop","matched_stop":null}]`),
			want: `,"matched_stop":null`,
		},
		"VLLMStopReason": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":null}]`,
				`[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":"\n\n"}]`),
			want: `,"stop_reason":"\n\n"`,
		},
		"VLLMTokenIDsNotKept": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,"token_ids":[]}]`,
				`[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":null,"token_ids":[9707,0]}]`,
				`[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[151645]}]`),
			want: `,"stop_reason":null`,
		},
		"NoneSent": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"Hello!"},"logprobs":null,"finish_reason":"stop"}]`),
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			choice := streamedChoice(t, tc.events)
			delete(choice, "message")
			got, err := json.Marshal(choice)
			require.NoError(t, err)
			require.JSONEq(t, `{"index":0,"logprobs":null,"finish_reason":"stop"`+tc.want+`}`, string(got))
		})
	}
}

// A call whose arguments come whole in its first chunk (Ollama, Gemini) reaches clients in one
// delta that opens the call and carries the arguments.
func TestStream_OpenAIWholeArgumentsInFirstChunk(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-838","object":"chat.completion.chunk","created":1744438886,"model":"qwen2.5-coder:7b","system_fingerprint":"fp_ollama"`
	resp, got := sendOpenAIStream(t, openAIChunks(env,
		`[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_hk81qg8b","index":0,"type":"function","function":{"name":"run_command","arguments":"{\"command\":\"ls -la\"}"}}]},"finish_reason":null}]`,
		`[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"tool_calls"}]`))
	require.Equal(t, []llm.Delta{{Type: llm.DeltaInputJSON, ToolID: "call_hk81qg8b", ToolName: "run_command",
		Text: `{"command":"ls -la"}`}}, got.all)
	require.Contains(t, string(resp.Body), `"function":{"arguments":"{\"command\":\"ls -la\"}","name":"run_command"}`)
}

// storedToolCalls returns the tool_calls of the first choice of a stored Chat Completions message.
func storedToolCalls(t *testing.T, body []byte) string {
	t.Helper()
	var msg struct {
		Choices []struct {
			Message struct {
				ToolCalls json.RawMessage `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(body, &msg))
	require.NotEmpty(t, msg.Choices)
	return string(msg.Choices[0].Message.ToolCalls)
}

// A piece without index that brings an id the open call does not have starts a new call, whether
// the open call has another id or none: servers send a call's id on its first piece (OpenAI's
// protocol; Gemini sends each unindexed call whole with its id), never later, so an id after a
// call's first piece is the next call's. A call opened by a piece that brought nothing (no id,
// name nor arguments) takes the id.
func TestStream_OpenAIUnindexedNewIDOpensACall(t *testing.T) {
	t.Parallel()
	const env = `"id":"c9","object":"chat.completion.chunk","created":1758000000,"model":"proxy"`
	for name, tc := range map[string]struct {
		events []string
		want   string
		byTool map[int]string
	}{
		"AfterACallWithoutID": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want: `[{"id":"","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
				{"id":"call_2","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]`,
			byTool: map[int]string{0: `{"city":"Paris"}`, 1: `{"tz":"CET"}`},
		},
		"AfterAnEmptyPiece": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"type":"function"}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_1","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want:   `[{"id":"call_1","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]`,
			byTool: map[int]string{0: `{"tz":"CET"}`},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			resp, got := sendOpenAIStream(t, tc.events)
			require.JSONEq(t, tc.want, storedToolCalls(t, resp.Body))
			byTool := map[int]string{}
			for _, d := range got.all {
				byTool[d.ToolIndex] += d.Text
			}
			require.Equal(t, tc.byTool, byTool)
		})
	}
}

// Ollama's compatible endpoint gives every tool call of an answer index 0 when the model's parser
// numbers none (its legacy tool parsing): each call comes whole, with its own id, in a chunk of
// its own or beside the others in one. A piece at an index whose call has another id opens the
// next call: each is stored as its own call, and reaches clients under its own tool index, its
// position in the stored message. Pieces after it without id, at that index, continue it, as do
// pieces with a new id but no name; an index the server names later is a call of its own, not
// the one opened for the reused index.
func TestStream_OpenAIReusedIndexNewIDOpensACall(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-18","object":"chat.completion.chunk","created":1744446075,"model":"qwen2.5-coder:7b","system_fingerprint":"fp_ollama"`
	const ab = `[{"id":"call_a","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}},
		{"id":"call_b","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}}]`
	abDeltas := []llm.Delta{
		{Type: llm.DeltaInputJSON, ToolIndex: 0, ToolID: "call_a", ToolName: "file_write", Text: `{"filePath":"hello.py"}`},
		{Type: llm.DeltaInputJSON, ToolIndex: 1, ToolID: "call_b", ToolName: "file_write", Text: `{"filePath":"world.py"}`},
	}
	abPieces := []llm.Delta{ // the calls' arguments in two pieces each
		{Type: llm.DeltaInputJSON, ToolIndex: 0, ToolID: "call_a", ToolName: "file_write", Text: `{"filePath":`},
		{Type: llm.DeltaInputJSON, ToolIndex: 0, Text: `"hello.py"}`},
		{Type: llm.DeltaInputJSON, ToolIndex: 1, ToolID: "call_b", ToolName: "file_write", Text: `{"filePath":`},
		{Type: llm.DeltaInputJSON, ToolIndex: 1, Text: `"world.py"}`},
	}
	for name, tc := range map[string]struct {
		events     []string
		want       string
		wantDeltas []llm.Delta
	}{
		"ChunkPerCall": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}}]},"finish_reason":null}]`,
				`[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_b","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}}]},"finish_reason":null}]`,
				`[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"tool_calls"}]`),
			want:       ab,
			wantDeltas: abDeltas,
		},
		"CallsInOneChunk": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","content":"","tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}},{"id":"call_b","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}}]},"finish_reason":null}]`,
				`[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"tool_calls"}]`),
			want:       ab,
			wantDeltas: abDeltas,
		},
		"ArgumentsContinued": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"hello.py\"}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_b","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"world.py\"}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want:       ab,
			wantDeltas: abPieces,
		},
		"ThenTheNextIndex": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_b","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":1,"type":"function","function":{"name":"run","arguments":"{}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"world.py\"}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want: `[{"id":"call_a","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}},
				{"id":"call_b","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}},
				{"id":"","type":"function","function":{"name":"run","arguments":"{}"}}]`,
			wantDeltas: []llm.Delta{
				abDeltas[0],
				{Type: llm.DeltaInputJSON, ToolIndex: 1, ToolID: "call_b", ToolName: "file_write", Text: `{"filePath":`},
				{Type: llm.DeltaInputJSON, ToolIndex: 2, ToolName: "run", Text: `{}`},
				{Type: llm.DeltaInputJSON, ToolIndex: 1, Text: `"world.py"}`},
			},
		},
		// A third call at the index the second was moved from opens a call of its own, after the
		// second; the pieces of that index then continue the third.
		"ThirdCallAtTheIndex": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_b","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_c","index":0,"type":"function","function":{"name":"run","arguments":"{\"n\":"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"1}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want: `[{"id":"call_a","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}},
				{"id":"call_b","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}},
				{"id":"call_c","type":"function","function":{"name":"run","arguments":"{\"n\":1}"}}]`,
			wantDeltas: []llm.Delta{
				abDeltas[0], abDeltas[1],
				{Type: llm.DeltaInputJSON, ToolIndex: 2, ToolID: "call_c", ToolName: "run", Text: `{"n":`},
				{Type: llm.DeltaInputJSON, ToolIndex: 2, Text: `1}`},
			},
		},
		// A server that repeats a call's id and name on every piece (Fireworks) and gives every
		// call index 0: a repeat continues the call, a new id opens the next.
		"RepeatedIDAndName": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"file_write","arguments":"\"hello.py\"}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_b","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_b","index":0,"type":"function","function":{"name":"file_write","arguments":"\"world.py\"}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want:       ab,
			wantDeltas: abPieces,
		},
		// A call sent without index (Gemini's shape) and then one at index 0 with another id: the
		// indexed call is the next, and so is a third at index 0.
		"UnindexedThenReusedIndex": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_a","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_b","index":0,"type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_c","index":0,"type":"function","function":{"name":"run","arguments":"{}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want: `[{"id":"call_a","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}},
				{"id":"call_b","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"world.py\"}"}},
				{"id":"call_c","type":"function","function":{"name":"run","arguments":"{}"}}]`,
			wantDeltas: []llm.Delta{
				abDeltas[0], abDeltas[1],
				{Type: llm.DeltaInputJSON, ToolIndex: 2, ToolID: "call_c", ToolName: "run", Text: `{}`},
			},
		},
		// Poolside sends a call's later pieces under another id than its first, without the name:
		// they continue the call.
		"NewIDWithoutNameContinues": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"role":"assistant","tool_calls":[{"id":"call_a","index":0,"type":"function","function":{"name":"file_write","arguments":""}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_a2","index":0,"function":{"arguments":"{\"filePath\":"}}]}}]`,
				`[{"index":0,"delta":{"tool_calls":[{"id":"call_a2","index":0,"function":{"arguments":"\"hello.py\"}"}}]}}]`,
				`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
			want: `[{"id":"call_a2","type":"function","function":{"name":"file_write","arguments":"{\"filePath\":\"hello.py\"}"}}]`,
			wantDeltas: []llm.Delta{
				{Type: llm.DeltaInputJSON, ToolIndex: 0, ToolID: "call_a", ToolName: "file_write"},
				{Type: llm.DeltaInputJSON, ToolIndex: 0, ToolID: "call_a2", Text: `{"filePath":`},
				{Type: llm.DeltaInputJSON, ToolIndex: 0, Text: `"hello.py"}`},
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			requireToolCallsStreamed(t, tc.events, tc.want, tc.wantDeltas)
		})
	}
}

// Members of a chunk's top level that its first chunk did not have (or had null) are kept in the
// stored message at their last non-null value, as a server's own choice members are: SGLang sends
// sglext (cached_tokens_details, routed_experts...) on a chunk of its own near the end, which its
// non-streaming message has at the top. The first chunk's members keep its values (SGLang's
// created is each chunk's time); a list member is a piece per chunk, not kept.
func TestStream_OpenAILaterTopLevelMembersKept(t *testing.T) {
	t.Parallel()
	const env = `"id":"5c1e","object":"chat.completion.chunk","model":"qwen3-8b"`
	for name, tc := range map[string]struct {
		events []string
		want   string
	}{
		"SGLangExtension": {
			events: []string{
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}`,
				`data: {` + env + `,"created":1738000001,"choices":[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":null}],"usage":null}`,
				`data: {` + env + `,"created":1738000002,"choices":[{"index":0,"delta":{"content":null},"logprobs":null,"finish_reason":"stop"}],"usage":null}`,
				`data: {` + env + `,"created":1738000002,"choices":[],"usage":null,"sglext":{"cached_tokens_details":{"device":5,"host":0}}}`,
				`data: {` + env + `,"created":1738000002,"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11},"sglext":null}`,
				`data: [DONE]`,
			},
			want: `"created":1738000000,"sglext":{"cached_tokens_details":{"device":5,"host":0}}`,
		},
		"OnATextChunk": {
			events: []string{
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null,"system_fingerprint":null}`,
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":null}],"usage":null,"system_fingerprint":"fp_1","weight_version":"v1","token_ids":[9707]}`,
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":null}],"usage":null,"system_fingerprint":"fp_2","weight_version":"v2"}`,
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null,"weight_version":null}`,
				`data: [DONE]`,
			},
			want: `"created":1738000000,"system_fingerprint":"fp_2","weight_version":"v2"`,
		},
		"EscapedKeys": {
			events: []string{
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"},"logprobs":null,"finish_reason":null}]}`,
				`data: {` + env + `,"cr\u0065ated":1738000009,"choices":[],"sgl\u0065xt":{"routed_experts":"AAE="},"\u0055sage":{"x":1}}`,
				`data: [DONE]`,
			},
			want: `"created":1738000000,"sglext":{"routed_experts":"AAE="}`,
		},
		// SGLang's ids_framed mode sends sglext in two chunks, each with some of its members
		// (the token ids under an event of their own): its non-streaming message has them all in
		// one sglext. Objects are merged member by member, each at its last non-null value.
		"SGLangIDsFramed": {
			events: []string{
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}`,
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"content":"Hello!"},"logprobs":null,"finish_reason":null}],"usage":null}`,
				`data: {` + env + `,"created":1738000001,"choices":[{"index":0,"delta":{"content":null},"logprobs":null,"finish_reason":"stop"}],"usage":null}`,
				`data: {` + env + `,"created":1738000001,"choices":[],"usage":null,"sglext":{"routed_experts":"AAE=","cached_tokens_details":{"device":5,"host":0}}}`,
				"event: sglext_ids\ndata: {" + env + `,"created":1738000001,"choices":[],"usage":null,"sglext":{"input_ids":[9707,0],"output_ids":[[9707,0,151645]],"routed_experts":null}}`,
				`data: {` + env + `,"created":1738000001,"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`,
				`data: [DONE]`,
			},
			want: `"created":1738000000,"sglext":{"routed_experts":"AAE=","cached_tokens_details":{"device":5,"host":0},"input_ids":[9707,0],"output_ids":[[9707,0,151645]]}`,
		},
		"OnlyNull": { // a member that only came null is not added
			events: []string{
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
				`data: {` + env + `,"created":1738000000,"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}],"sglext":null}`,
				`data: {` + env + `,"created":1738000000,"choices":[],"sglext":null,"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`,
				`data: [DONE]`,
			},
			want: `"created":1738000000`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var msg map[string]json.RawMessage
			require.NoError(t, json.Unmarshal([]byte(streamedBody(t, llm.KindOpenAI, tc.events)), &msg))
			delete(msg, "choices")
			delete(msg, "usage")
			got, err := json.Marshal(msg)
			require.NoError(t, err)
			require.JSONEq(t, `{"id":"5c1e","object":"chat.completion","model":"qwen3-8b",`+tc.want+`}`, string(got))
		})
	}
}

// Servers that number tool calls by something else than their place in the message skip
// indexes or start past 0: proxies that turn Anthropic's content blocks into Chat Completions
// chunks give a call its block's index (LiteLLM over Bedrock sends the first call after the text
// at index 1, CLIProxyAPI 1, 2, 3), others index -1 (Zhipu's GLM, a Bedrock gateway). Each call
// is stored at the next place in tool_calls, with no empty call for an index nobody used, and
// its deltas carry that place as their tool index, as a non-streaming answer numbers its calls.
// A piece that brings a call nothing (no id, name nor arguments) gives it no place: calls take
// places in the order they first bring something, not by the server's index.
func TestStream_OpenAISkippedToolIndexesStoredDense(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-ab2d","object":"chat.completion.chunk","created":1749032296,"model":"us.anthropic.claude-3-7-sonnet"`
	const two = `[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
		{"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]`
	twoDeltas := []llm.Delta{
		{Type: llm.DeltaInputJSON, ToolIndex: 0, ToolID: "call_a", ToolName: "get_weather", Text: `{"city":"Paris"}`},
		{Type: llm.DeltaInputJSON, ToolIndex: 1, ToolID: "call_b", ToolName: "get_time", Text: `{"tz":"CET"}`},
	}
	whole := func(index int, id, name, args string) string {
		return fmt.Sprintf(`[{"index":0,"delta":{"tool_calls":[{"index":%d,"id":%q,"type":"function","function":{"name":%q,"arguments":%q}}]}}]`,
			index, id, name, args)
	}
	finish := `[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`
	for name, tc := range map[string]struct {
		events     []string
		want       string
		wantDeltas []llm.Delta
	}{
		"StartsAtOne": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"content":"","role":"assistant","tool_calls":[{"id":"tooluse_1","function":{"arguments":"","name":"jira_get_worklog"},"type":"function","index":1}]}}]`,
				`[{"index":0,"delta":{"content":"","tool_calls":[{"function":{"arguments":"{\"issue\":"},"type":"function","index":1}]}}]`,
				`[{"index":0,"delta":{"content":"","tool_calls":[{"function":{"arguments":"\"PRJ-1\"}"},"type":"function","index":1}]}}]`,
				finish),
			want: `[{"id":"tooluse_1","type":"function","function":{"name":"jira_get_worklog","arguments":"{\"issue\":\"PRJ-1\"}"}}]`,
			wantDeltas: []llm.Delta{
				{Type: llm.DeltaInputJSON, ToolIndex: 0, ToolID: "tooluse_1", ToolName: "jira_get_worklog"},
				{Type: llm.DeltaInputJSON, ToolIndex: 0, Text: `{"issue":`},
				{Type: llm.DeltaInputJSON, ToolIndex: 0, Text: `"PRJ-1"}`},
			},
		},
		"StartsAtOneThenTwo": {
			events: openAIChunks(env, whole(1, "call_a", "get_weather", `{"city":"Paris"}`),
				whole(2, "call_b", "get_time", `{"tz":"CET"}`), finish),
			want:       two,
			wantDeltas: twoDeltas,
		},
		"SkipsAnIndex": {
			events: openAIChunks(env, whole(0, "call_a", "get_weather", `{"city":"Paris"}`),
				whole(2, "call_b", "get_time", `{"tz":"CET"}`), finish),
			want:       two,
			wantDeltas: twoDeltas,
		},
		"NegativeThenZero": {
			events: openAIChunks(env, whole(-1, "call_a", "get_weather", `{"city":"Paris"}`),
				whole(0, "call_b", "get_time", `{"tz":"CET"}`), finish),
			want:       two,
			wantDeltas: twoDeltas,
		},
		"PlacedInTheOrderTheyBringSomething": {
			events: openAIChunks(env,
				`[{"index":0,"delta":{"tool_calls":[{"index":0,"type":"function"}]}}]`,
				whole(1, "call_a", "get_weather", `{"city":"Paris"}`),
				whole(0, "call_b", "get_time", `{"tz":"CET"}`), finish),
			want:       two,
			wantDeltas: twoDeltas,
		},
		"IndexThatBringsNothing": {
			events: openAIChunks(env, whole(0, "call_a", "get_weather", `{"city":"Paris"}`),
				`[{"index":0,"delta":{"tool_calls":[{"index":1,"type":"function","function":{"arguments":""}}]}}]`,
				whole(2, "call_b", "get_time", `{"tz":"CET"}`), finish),
			want:       two,
			wantDeltas: twoDeltas,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			requireToolCallsStreamed(t, tc.events, tc.want, tc.wantDeltas)
		})
	}
}

// SGLang before its serving layer was rewritten (0.4.6, the JSON tool parsers: Qwen's
// <tool_call>, Llama's, Mistral's) sent a call's name at the index of its tool in the request's
// tools, and the call's arguments at the call's own index (0 for every call with Qwen's parser,
// which starts over after each call), each chunk with a new random id and the arguments' pieces
// with an empty name. A piece that brings arguments and no name, at an index no call has, or at
// an index whose call is not the one the last piece went to and with an id that call lacks,
// continues the call the last piece went to, as do the later pieces of that index, until a
// named piece there opens a call. Each call is stored once, with its name and all its arguments.
func TestStream_OpenAINamedAtItsToolsIndexArgumentsAtItsOwn(t *testing.T) {
	t.Parallel()
	const env = `"id":"27b2495d4c3a4511a5c8403f5a43db78","object":"chat.completion.chunk","created":1747280110,"model":"Qwen/Qwen3-32B"`
	// piece is a chunk as SGLang sent it, at the server's index; it stands for the delta clients
	// get, under the tool index pos.
	type piece struct {
		index, pos     int
		id, name, args string
	}
	const weather, tz = `{"city": "Paris"}`, `{"tz": "CET"}`
	for name, tc := range map[string]struct {
		pieces []piece
		want   string // the stored tool_calls
	}{
		// The request's tools are get_weather and get_time; the model calls get_time.
		"SecondToolOnly": {
			pieces: []piece{{1, 0, "call_kiRj2rWPTJqX3yLwcZmHew", "get_time", ""},
				{0, 0, "call_8bQ2yv1nTfaE0o3kRZpLcA", "", `{"tz": "`}, {0, 0, "call_Yc4m1WJ7S0qu5xg2DkbN9w", "", `CET"}`}},
			want: `[{"id":"call_Yc4m1WJ7S0qu5xg2DkbN9w","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"CET\"}"}}]`,
		},
		"SecondToolThenFirst": {
			pieces: []piece{{1, 0, "r1", "get_time", ""}, {0, 0, "r2", "", tz},
				{0, 1, "r3", "get_weather", ""}, {0, 1, "r4", "", `{"city": `}, {0, 1, "r5", "", `"Paris"}`}},
			want: `[{"id":"r2","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"CET\"}"}},
				{"id":"r5","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]`,
		},
		"FirstToolThenSecond": {
			pieces: []piece{{0, 0, "r1", "get_weather", ""}, {0, 0, "r2", "", weather},
				{1, 1, "r3", "get_time", ""}, {0, 1, "r4", "", `{"tz": `}, {0, 1, "r5", "", `"CET"}`}},
			want: `[{"id":"r2","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
				{"id":"r5","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"CET\"}"}}]`,
		},
		// Mistral's and Llama's parsers number the calls 0, 1...: the second call's arguments
		// come at index 1, which the first call's name took.
		"CallsNumberedTheirToolsReversed": {
			pieces: []piece{{1, 0, "r1", "get_time", ""}, {0, 0, "r2", "", tz},
				{0, 1, "r3", "get_weather", ""}, {1, 1, "r4", "", weather}},
			want: `[{"id":"r2","type":"function","function":{"name":"get_time","arguments":"{\"tz\": \"CET\"}"}},
				{"id":"r4","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]`,
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var events []string
			var want []llm.Delta
			for _, p := range tc.pieces {
				events = append(events, fmt.Sprintf(`[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":[{"id":%q,"index":%d,"type":"function","function":{"name":%q,"arguments":%q}}]},"logprobs":null,"finish_reason":null,"matched_stop":null}]`,
					p.id, p.index, p.name, p.args))
				want = append(want, llm.Delta{Type: llm.DeltaInputJSON, ToolIndex: p.pos, ToolID: p.id, ToolName: p.name, Text: p.args})
			}
			events = append(events, `[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":null,"tool_calls":null},"logprobs":null,"finish_reason":"tool_calls","matched_stop":null}]`)
			requireToolCallsStreamed(t, openAIChunks(env, events...), tc.want, want)
		})
	}
}

// LocalAI gives every tool call of a streamed answer the same id (the request's, or the
// completion's), whether they are parallel calls or, as its streamed JSON parser sent them for a
// while, one call emitted again at the next index, whole or in a name piece and an arguments
// piece. The stream cannot tell the two apart: a piece at another index, named,
// with the id of an earlier call, is another call, and each is stored as sent.
func TestStream_OpenAISameIDAtAnotherIndexIsAnotherCall(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-3f1c","object":"chat.completion.chunk","created":1746662400,"model":"qwen3-4b"`
	const id = "LipwoT0puK4tQY6nxW39FNRyvQ6Hrh8p"
	piece := func(index int, name, args string) string {
		return fmt.Sprintf(`[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":%d,"id":%q,"type":"function","function":{"name":%q,"arguments":%q}}]}}]`,
			index, id, name, args)
	}
	resp, got := sendOpenAIStream(t, openAIChunks(env,
		piece(0, "exec", `{"cmd":"ls"}`),
		piece(1, "exec", ""), piece(1, "", `{"cmd":"pwd"}`),
		`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`))
	require.JSONEq(t, `[{"id":"`+id+`","type":"function","function":{"name":"exec","arguments":"{\"cmd\":\"ls\"}"}},
		{"id":"`+id+`","type":"function","function":{"name":"exec","arguments":"{\"cmd\":\"pwd\"}"}}]`,
		storedToolCalls(t, resp.Body))
	require.Equal(t, []llm.Delta{
		{Type: llm.DeltaInputJSON, ToolIndex: 0, ToolID: id, ToolName: "exec", Text: `{"cmd":"ls"}`},
		{Type: llm.DeltaInputJSON, ToolIndex: 1, ToolID: id, ToolName: "exec"},
		{Type: llm.DeltaInputJSON, ToolIndex: 1, Text: `{"cmd":"pwd"}`},
	}, got.all)
}

// Some servers open a call with a piece that brings its id and the first of its arguments but no
// name, or an empty one, and send the name in a later piece at the call's index (the shape the
// AI SDK's openai-compatible provider learned to accept; vLLM's Command-A parser sends the empty
// name first), or with a piece of its id alone (name and arguments empty). A parallel call
// opened so is a call of its own, not more of the earlier call's: after a call that has its
// arguments, after one that has no name yet, and, without arguments, after a named one. So is
// each of interleaved parallel calls whose pieces come under a new id each, once each call has
// arguments. A nameless piece with arguments at another index continues the named call the last
// piece went to only when that call has no arguments yet (SGLang's name at its tool's index,
// TestStream_OpenAINamedAtItsToolsIndexArgumentsAtItsOwn) or the piece has no id (Nebius, and
// LibreChat's agents API, which sent a call's id at another index than its arguments).
func TestStream_OpenAINamelessPiecesAtAnotherIndex(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-9","object":"chat.completion.chunk","created":1747280110,"model":"m"`
	tool := func(index int, id, name, args string) string {
		return fmt.Sprintf(`[{"index":0,"delta":{"tool_calls":[{"index":%d,"id":%q,"type":"function","function":{"name":%q,"arguments":%q}}]},"finish_reason":null}]`,
			index, id, name, args)
	}
	noID := func(index int, name, args string) string {
		return fmt.Sprintf(`[{"index":0,"delta":{"tool_calls":[{"index":%d,"function":{"name":%q,"arguments":%q}}]},"finish_reason":null}]`,
			index, name, args)
	}
	const two = `[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"ls\"}"}},
		{"id":"call_2","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"pwd\"}"}}]`
	for name, tc := range map[string]struct {
		events []string
		want   string // the stored tool_calls
		pos    []int  // the tool index of each delta clients get
	}{
		"NameAfterArguments": {
			events: []string{tool(0, "call_1", "bash", ""), noID(0, "", `{"cmd": "ls"}`),
				tool(1, "call_2", "", `{"cmd": `), noID(1, "bash", `"pwd"}`)},
			want: two, pos: []int{0, 0, 1, 1},
		},
		"EmptyNameWithArgumentsThenName": {
			events: []string{tool(0, "call_1", "bash", `{"cmd": "ls"}`),
				tool(1, "call_2", "", `{"cmd": "pwd"}`), noID(1, "bash", "")},
			want: two, pos: []int{0, 1, 1},
		},
		"NamesAfterArgumentsOfBoth": {
			events: []string{tool(0, "call_1", "", ""), tool(1, "call_2", "", `{"cmd": "pwd"}`),
				noID(1, "bash", ""), noID(0, "bash", `{"cmd": "ls"}`)},
			want: two, pos: []int{0, 1, 1, 0},
		},
		"IDAloneAfterANamedCall": {
			events: []string{tool(0, "call_1", "get_time", ""), tool(1, "call_2", "", ""),
				tool(1, "call_2", "bash", `{"cmd": "pwd"}`)},
			want: `[{"id":"call_1","type":"function","function":{"name":"get_time","arguments":""}},
				{"id":"call_2","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"pwd\"}"}}]`,
			pos: []int{0, 1, 1},
		},
		// Nebius's gpt-oss adapter sent a call's last piece of arguments at the next index, without
		// id: it continues the call, as would each at a new index.
		"LastPieceAtTheNextIndex": {
			events: []string{tool(0, "call_1", "bash", ""), noID(0, "", `{"cmd": `), noID(0, "", `"l`),
				noID(1, "", `s"}`), tool(1, "call_2", "bash", `{"cmd": "pwd"}`)},
			want: two, pos: []int{0, 0, 0, 0, 1},
		},
		// ... and so it does after a parameterless call, which has no arguments.
		"LastPieceAtTheNextIndexAfterAParameterlessCall": {
			events: []string{tool(0, "call_0", "get_time", ""), tool(1, "call_1", "bash", ""),
				noID(1, "", `{"cmd": `), noID(2, "", `"ls"}`)},
			want: `[{"id":"call_0","type":"function","function":{"name":"get_time","arguments":""}},
				{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"ls\"}"}}]`,
			pos: []int{0, 1, 1, 1},
		},
		// LibreChat's agents API sent a call's id and name at its run step's index and its
		// arguments, without id, at the call's own index.
		"ArgumentsAtAnotherIndexThanTheID": {
			events: []string{tool(2, "call_1", "bash", ""), noID(1, "", `{"cmd": `), noID(1, "", `"ls"}`)},
			want:   `[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"ls\"}"}}]`,
			pos:    []int{0, 0, 0},
		},
		// A parameterless call has no arguments (Anthropic sends none for a tool without input);
		// the next call's arguments, at an index below its id's, are still its own.
		"ArgumentsAtAnotherIndexAfterAParameterlessCall": {
			events: []string{tool(2, "call_0", "get_time", ""), tool(3, "call_1", "bash", ""),
				noID(1, "", `{"cmd": `), noID(1, "", `"ls"}`)},
			want: `[{"id":"call_0","type":"function","function":{"name":"get_time","arguments":""}},
				{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"cmd\": \"ls\"}"}}]`,
			pos: []int{0, 1, 1, 1},
		},
		"InterleavedPiecesUnderNewIDs": {
			events: []string{tool(0, "call_0", "bash", `{"cmd": `), tool(1, "call_x", "bash", `{"cmd": `),
				tool(0, "call_1", "", `"ls"}`), tool(1, "call_2", "", `"pwd"}`)},
			want: two, pos: []int{0, 1, 0, 1},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			events := append(tc.events, `[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`)
			requireToolCallsAt(t, openAIChunks(env, events...), tc.want, tc.pos)
		})
	}
}

// OmniRoute's Responses-to-Chat translator (before its fix) sent each call's header (id, name,
// empty arguments) when the Responses item opened and advanced its tool index only when an item
// closed: parallel calls, opened before any closed, all had their header at index 0, and each
// call's arguments, sent whole when it closed, came at index 1, 2... without id or name, in the
// order the calls were opened. opencode2api sent one call's header at index 0 and its arguments
// at 1 ("id":null, an empty name). Each call's arguments are stored with its header, and reach
// clients under its tool index.
func TestStream_OpenAIHeadersAtOneIndexArgumentsAtTheNext(t *testing.T) {
	t.Parallel()
	const env = `"id":"chatcmpl-1755830000000","object":"chat.completion.chunk","created":1755830000,"model":"gpt-5.1-codex"`
	headerAt := func(index int, id, name string) string {
		return fmt.Sprintf(`[{"index":0,"delta":{"tool_calls":[{"index":%d,"id":%q,"type":"function","function":{"name":%q,"arguments":""}}]},"finish_reason":null}]`,
			index, id, name)
	}
	header := func(id, name string) string { return headerAt(0, id, name) }
	args := func(index int, args string) string {
		return fmt.Sprintf(`[{"index":0,"delta":{"tool_calls":[{"index":%d,"function":{"arguments":%q}}]},"finish_reason":null}]`,
			index, args)
	}
	for name, tc := range map[string]struct {
		events []string
		want   string // the stored tool_calls
		pos    []int  // the tool index of each delta clients get
	}{
		"TwoCalls": {
			events: []string{header("call_a", "get_weather"), header("call_b", "get_time"),
				args(1, `{"city":"Paris"}`), args(2, `{"tz":"CET"}`)},
			want: `[{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
				{"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\":\"CET\"}"}}]`,
			pos: []int{0, 1, 0, 1},
		},
		"ThreeCallsOfOneTool": {
			events: []string{header("call_a", "bash"), header("call_b", "bash"), header("call_c", "bash"),
				args(1, `{"cmd":"ls"}`), args(2, `{"cmd":"pwd"}`), args(3, `{"cmd":"id"}`)},
			want: `[{"id":"call_a","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\"}"}},
				{"id":"call_b","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"pwd\"}"}},
				{"id":"call_c","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"id\"}"}}]`,
			pos: []int{0, 1, 2, 0, 1, 2},
		},
		"ArgumentsInPieces": {
			events: []string{header("call_a", "bash"), header("call_b", "bash"),
				args(1, `{"cmd":`), args(1, `"ls"}`), args(2, `{"cmd":`), args(2, `"pwd"}`)},
			want: `[{"id":"call_a","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\"}"}},
				{"id":"call_b","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"pwd\"}"}}]`,
			pos: []int{0, 1, 0, 0, 1, 1},
		},
		// A call that closed before the next opened has its header at 0 and its arguments at
		// 1; the two opened after it both have theirs at 1, and their arguments at 2 and 3.
		"OneCallThenTwoInParallel": {
			events: []string{header("call_a", "bash"), args(1, `{"cmd":"ls"}`),
				headerAt(1, "call_b", "bash"), headerAt(1, "call_c", "bash"),
				args(2, `{"cmd":"pwd"}`), args(3, `{"cmd":"id"}`)},
			want: `[{"id":"call_a","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\"}"}},
				{"id":"call_b","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"pwd\"}"}},
				{"id":"call_c","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"id\"}"}}]`,
			pos: []int{0, 0, 1, 2, 1, 2},
		},
		// A server without ids sends each call whole at its index: a named piece is a call of
		// its own, even after a parameterless call, which has no arguments.
		"WholeCallsWithoutIDs": {
			events: []string{`[{"index":0,"delta":{"tool_calls":[{"index":0,"type":"function","function":{"name":"get_time","arguments":""}}]},"finish_reason":null}]`,
				`[{"index":0,"delta":{"tool_calls":[{"index":1,"type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\"}"}}]},"finish_reason":null}]`},
			want: `[{"id":"","type":"function","function":{"name":"get_time","arguments":""}},
				{"id":"","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\"}"}}]`,
			pos: []int{0, 1},
		},
		"OneCall": {
			events: []string{header("call_a", "bash"),
				`[{"index":0,"delta":{"tool_calls":[{"index":1,"id":null,"type":"function","function":{"name":"","arguments":"{\"cmd\":\"free -h\"}"}}]},"finish_reason":null}]`},
			want: `[{"id":"call_a","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"free -h\"}"}}]`,
			pos:  []int{0, 0},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			events := append(tc.events, `[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`)
			requireToolCallsAt(t, openAIChunks(env, events...), tc.want, tc.pos)
		})
	}
}
