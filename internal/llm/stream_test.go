package llm_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// simBundle is a Provider pointed at a real simulator.
func simProvider(t *testing.T, kind llm.Kind, cfg llmsim.Config) (llm.Provider, *llmsim.Server) {
	t.Helper()
	sim := llmsim.New(cfg)
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	p, err := llm.New(llm.Config{Kind: kind, BaseURL: srv.URL, APIKey: testKey, HTTPClient: srv.Client()})
	require.NoError(t, err)
	return p, sim
}

// deltas collects what OnDelta receives.
type deltas struct {
	mu  sync.Mutex
	all []llm.Delta
}

func (d *deltas) add(x llm.Delta) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.all = append(d.all, x)
}

func (d *deltas) text(typ string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var b strings.Builder
	for _, x := range d.all {
		if x.Type == typ {
			b.WriteString(x.Text)
		}
	}
	return b.String()
}

func streamBody(kind llm.Kind) []byte {
	var m map[string]any
	_ = json.Unmarshal(bodyFor(kind), &m)
	m["stream"] = true
	b, _ := json.Marshal(m)
	return b
}

// TestProvider_Stream_SameAsWhole proves that a streamed answer is assembled into the message a
// non-streaming call returns (content, stop reason, usage), and that the deltas add up to its text.
func TestProvider_Stream_SameAsWhole(t *testing.T) {
	t.Parallel()
	for _, kind := range []llm.Kind{llm.KindAnthropic, llm.KindOpenAI} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			p, _ := simProvider(t, kind, llmsim.Config{ReplyTokens: 25})
			whole, err := p.Send(t.Context(), bodyFor(kind), llm.SendOptions{})
			require.NoError(t, err)
			var got deltas
			streamed, err := p.Send(t.Context(), streamBody(kind), llm.SendOptions{OnDelta: got.add})
			require.NoError(t, err)
			require.Equal(t, whole.Usage, streamed.Usage, "usage feeds the token limiter as before")
			require.Greater(t, len(got.all), 10, "one delta per token")

			var w, s map[string]any
			require.NoError(t, json.Unmarshal(whole.Body, &w))
			require.NoError(t, json.Unmarshal(streamed.Body, &s))
			if kind == llm.KindAnthropic {
				require.Equal(t, w["content"], s["content"])
				require.Equal(t, w["stop_reason"], s["stop_reason"])
				require.Equal(t, w["usage"], s["usage"])
				require.Equal(t, "message", s["type"])
				text := s["content"].([]any)[0].(map[string]any)["text"]
				require.Equal(t, text, got.text(llm.DeltaText))
			} else {
				require.Equal(t, w["choices"], s["choices"])
				require.Equal(t, w["usage"], s["usage"])
				require.Equal(t, "chat.completion", s["object"])
				msg := s["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
				require.Equal(t, msg["content"], got.text(llm.DeltaText))
			}
			require.Positive(t, streamed.TimeToFirstByte)
			streamed.Release()
			whole.Release()
		})
	}
}

// TestProvider_Stream_OnStream proves that a streamed answer's headers reach OnStream once, before
// the first delta, with the rate limit they report (the same Send's result carries), and that a
// non-streaming call does not call it.
func TestProvider_Stream_OnStream(t *testing.T) {
	t.Parallel()
	for _, kind := range []llm.Kind{llm.KindAnthropic, llm.KindOpenAI} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			p, _ := simProvider(t, kind, llmsim.Config{ReplyTokens: 5, Capacity: 40, RefillPerSecond: 20})
			var starts []llm.StreamStart
			deltasAtStart := -1
			var got deltas
			resp, err := p.Send(t.Context(), streamBody(kind), llm.SendOptions{OnDelta: got.add,
				OnStream: func(s llm.StreamStart) {
					starts = append(starts, s)
					deltasAtStart = len(got.all)
				}})
			require.NoError(t, err)
			defer resp.Release()
			require.Len(t, starts, 1)
			require.Zero(t, deltasAtStart, "called before the first delta")
			require.Equal(t, 200, starts[0].StatusCode)
			require.True(t, starts[0].RateLimit.Known, "the headers' rate limit")
			require.Equal(t, 40, starts[0].RateLimit.Limit)
			require.Equal(t, resp.RateLimit, starts[0].RateLimit, "what Send returns at the end")

			whole, err := p.Send(t.Context(), bodyFor(kind), llm.SendOptions{OnStream: func(llm.StreamStart) {
				t.Error("OnStream called for a non-streaming answer")
			}})
			require.NoError(t, err)
			whole.Release()
		})
	}
}

// sseHandler writes events verbatim, flushing each; pause, when set, is waited on before the
// events after index at.
func sseHandler(events []string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		for _, e := range events {
			_, _ = w.Write([]byte(e + "\n\n"))
			_ = http.NewResponseController(w).Flush()
		}
	}
}

// TestProvider_Stream_ToolDeltas proves that tool-use JSON deltas are carried faithfully and the
// tool input assembled: Anthropic input_json_delta and OpenAI tool call chunks.
func TestProvider_Stream_ToolDeltas(t *testing.T) {
	t.Parallel()

	t.Run("Anthropic", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llm.KindAnthropic, sseHandler([]string{
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}",
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"sig\"}}",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{}}}",
			": a comment line",
			"event: ping\ndata: {\"type\":\"ping\"}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"loc\"}}",
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"ation\\\": \\\"Paris\\\"}\"}}",
			"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}",
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":30}}",
			"event: message_stop\ndata: {\"type\":\"message_stop\"}",
		}))
		var got deltas
		resp, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{OnDelta: got.add})
		require.NoError(t, err)
		require.Equal(t, llm.Usage{InputTokens: 12, OutputTokens: 30}, resp.Usage)
		require.Equal(t, []llm.Delta{
			{Type: llm.DeltaThinking, Index: 0, Text: "hmm"},
			{Type: llm.DeltaInputJSON, Index: 1, ToolID: "toolu_1", ToolName: "get_weather"},
			// "c" may start the key's base64 form ("c2st..."): held for the block's next delta.
			{Type: llm.DeltaInputJSON, Index: 1, Text: `{"lo`},
			{Type: llm.DeltaInputJSON, Index: 1, Text: `cation": "Paris"}`},
		}, got.all)
		require.JSONEq(t, `{"id":"msg_1","type":"message","role":"assistant","model":"c",
			"content":[{"type":"thinking","thinking":"hmm","signature":"sig"},
				{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"location":"Paris"}}],
			"stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":30}}`, string(resp.Body))
	})

	t.Run("OpenAI", func(t *testing.T) {
		t.Parallel()
		chunk := func(choices string) string {
			return `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"g","choices":` + choices + `,"usage":null}`
		}
		var sent []byte
		b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, r *http.Request) {
			buf := make([]byte, 4096)
			n, _ := r.Body.Read(buf)
			sent = buf[:n]
			sseHandler([]string{
				chunk(`[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]`),
				chunk(`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"location\":"}}]},"finish_reason":null}]`),
				chunk(`[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]},"finish_reason":null}]`),
				chunk(`[{"index":0,"delta":{},"finish_reason":"tool_calls"}]`),
				`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"g","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}`,
				`data: [DONE]`,
			})(w, r)
		})
		var got deltas
		resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{OnDelta: got.add})
		require.NoError(t, err)
		require.Contains(t, string(sent), `"stream_options":{"include_usage":true}`, "usage is asked for")
		require.Equal(t, llm.Usage{InputTokens: 9, OutputTokens: 5}, resp.Usage)
		require.Equal(t, []llm.Delta{
			{Type: llm.DeltaInputJSON, ToolID: "call_1", ToolName: "get_weather"},
			{Type: llm.DeltaInputJSON, Text: `{"location":`},
			{Type: llm.DeltaInputJSON, Text: `"Paris"}`},
		}, got.all)
		require.JSONEq(t, `{"id":"chatcmpl-1","object":"chat.completion","created":7,"model":"g",
			"choices":[{"index":0,"logprobs":null,"finish_reason":"tool_calls","message":{"role":"assistant","content":null,"refusal":null,"annotations":[],
				"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}}]}}],
			"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}`, string(resp.Body))
	})
}

// TestProvider_Stream_Failures proves that a failure inside a stream is classified like any
// other: an overloaded_error event (Anthropic) or an error chunk (OpenAI) is a retryable
// *StatusError, a cut connection is a network error, a stall hits the attempt's deadline.
func TestProvider_Stream_Failures(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		kind   llm.Kind
		status int
		typ    string
	}{{llm.KindAnthropic, 529, "overloaded_error"}, {llm.KindOpenAI, 500, "server_error"}} {
		t.Run("ErrorEvent"+string(tc.kind), func(t *testing.T) {
			t.Parallel()
			p, sim := simProvider(t, tc.kind, llmsim.Config{})
			require.NoError(t, sim.SetFaults(llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 3}))
			var got deltas
			_, err := p.Send(t.Context(), streamBody(tc.kind), llm.SendOptions{OnDelta: got.add})
			se := asStatusError(t, err)
			require.True(t, se.MidStream)
			require.Equal(t, tc.status, se.StatusCode)
			require.Equal(t, tc.typ, se.Type)
			require.Equal(t, "llmsim reply", got.text(llm.DeltaText), "three tokens came first")
			d := retrypolicy.Classify(err, testNow)
			require.Equal(t, retrypolicy.ClassRetryable, d.Class)
		})
	}

	t.Run("Cut", func(t *testing.T) {
		t.Parallel()
		p, sim := simProvider(t, llm.KindAnthropic, llmsim.Config{})
		require.NoError(t, sim.SetFaults(llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 2, StreamFailMode: llmsim.StreamFailCut}))
		_, err := p.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{})
		te := asTransportError(t, err)
		require.False(t, te.Timeout())
		require.Equal(t, http.StatusOK, te.StatusCode, "the stream's headers came: the provider answered")
		require.Equal(t, retrypolicy.ClassNetwork, retrypolicy.Classify(err, testNow).Class)
		require.Zero(t, retrypolicy.Classify(err, testNow).StatusCode, "the answer's status is not the failure's")
	})

	t.Run("StallAfterFirstDelta", func(t *testing.T) {
		t.Parallel()
		p, sim := simProvider(t, llm.KindOpenAI, llmsim.Config{})
		require.NoError(t, sim.SetFaults(llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 1, StreamFailMode: llmsim.StreamFailStall}))
		// The first delta came, then nothing: well past the first-byte timeout the call is still
		// waiting (the attempt's own deadline applies now), until its context ends it.
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var once sync.Once
		onDelta := func(llm.Delta) { once.Do(func() { time.AfterFunc(2*time.Second, cancel) }) }
		_, err := p.Send(ctx, streamBody(llm.KindOpenAI), llm.SendOptions{FirstByteTimeout: time.Second, OnDelta: onDelta})
		asTransportError(t, err)
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, llm.ErrFirstByteTimeout)
	})

	t.Run("FirstByteTimeoutWaitsForTheFirstDelta", func(t *testing.T) {
		t.Parallel()
		// The opening events come at once, then nothing: no delta, so generation never started.
		b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, r *http.Request) {
			sseHandler([]string{
				"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[]}}",
				"event: ping\ndata: {\"type\":\"ping\"}",
			})(w, r)
			<-r.Context().Done()
		})
		_, err := b.provider.Send(callContext(t), streamBody(llm.KindAnthropic), llm.SendOptions{FirstByteTimeout: 50 * time.Millisecond})
		require.ErrorIs(t, err, llm.ErrFirstByteTimeout)
		require.Equal(t, retrypolicy.ClassTimeout, retrypolicy.Classify(err, testNow).Class)
	})

	t.Run("LastEventWithoutBlankLine", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llm.KindOpenAI, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]"))
		})
		resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{})
		require.NoError(t, err, "the end marker counts without its blank line")
		require.Contains(t, string(resp.Body), `"content":"hi"`)
	})

	t.Run("EndsWithoutEndMarker", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llm.KindOpenAI, sseHandler([]string{
			`data: {"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}]}`,
		}))
		_, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{})
		require.Equal(t, retrypolicy.ClassNetwork, retrypolicy.Classify(asTransportError(t, err), testNow).Class)
	})
}

// TestProvider_Stream_KeyMasked proves that a key the provider echoes in a delta is masked in
// the delta and in the assembled body, and kept out of a mid-stream error.
func TestProvider_Stream_KeyMasked(t *testing.T) {
	t.Parallel()
	b := setup(t, llm.KindAnthropic, sseHandler([]string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[]}}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"key " + testKey + "\"}}",
		"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"echo " + testKey + "\"}}",
	}))
	var got deltas
	_, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{OnDelta: got.add})
	requireNoSecret(t, err)
	se := asStatusError(t, err)
	require.Equal(t, 500, se.StatusCode)
	require.NotContains(t, se.Message, testKey)
	require.NotContains(t, got.text(llm.DeltaText), testKey)
	require.True(t, strings.HasPrefix(got.text(llm.DeltaText), "key "))
	require.False(t, errors.Is(err, llm.ErrDecode))
}

// TestProvider_Stream_SimulatorTools proves against the simulator that a streamed tool call is
// carried as input_json deltas (the tool's id and name on the first) and assembled into the
// input a non-streaming answer carries, whether its input comes in pieces or whole (Whole: in
// Anthropic's content_block_start, in OpenAI's first chunk of the call).
func TestProvider_Stream_SimulatorTools(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		kind  llm.Kind
		whole bool
	}{
		"Anthropic": {kind: llm.KindAnthropic}, "AnthropicWhole": {kind: llm.KindAnthropic, whole: true},
		"OpenAI": {kind: llm.KindOpenAI}, "OpenAIWhole": {kind: llm.KindOpenAI, whole: true},
	} {
		kind, tools := tc.kind, `[{"type":"function","function":{"name":"record"}}]`
		if kind == llm.KindAnthropic {
			tools = `[{"name":"record","input_schema":{"type":"object"}}]`
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p, _ := simProvider(t, kind, llmsim.Config{StreamToolInputWhole: tc.whole})
			var m map[string]any
			require.NoError(t, json.Unmarshal(streamBody(kind), &m))
			m["tools"] = json.RawMessage(tools)
			body, err := json.Marshal(m)
			require.NoError(t, err)
			var got deltas
			resp, err := p.Send(t.Context(), body, llm.SendOptions{OnDelta: got.add})
			require.NoError(t, err)
			var first llm.Delta
			for _, d := range got.all {
				if d.Type == llm.DeltaInputJSON {
					first = d
					break
				}
			}
			require.Equal(t, "record", first.ToolName)
			require.NotEmpty(t, first.ToolID)
			want := `{"reply":"llmsim reply to: hello from the prompt"}`
			require.JSONEq(t, want, got.text(llm.DeltaInputJSON))
			var out map[string]any
			require.NoError(t, json.Unmarshal(resp.Body, &out))
			if kind == llm.KindAnthropic {
				require.Equal(t, "tool_use", out["stop_reason"])
				input, _ := json.Marshal(out["content"].([]any)[1].(map[string]any)["input"])
				require.JSONEq(t, want, string(input))
			} else {
				choice := out["choices"].([]any)[0].(map[string]any)
				require.Equal(t, "tool_calls", choice["finish_reason"])
				call := choice["message"].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)
				require.JSONEq(t, want, call["function"].(map[string]any)["arguments"].(string))
				require.Equal(t, first.ToolID, call["id"])
			}
		})
	}
}

// TestProvider_Stream_SimulatorToolCallsAtIndexZero proves against the simulator that parallel
// tool calls a server streams all at index 0, each whole with its own id (llmsim's
// StreamToolCallsAtIndexZero, as Ollama sends them), are stored as the calls a non-streaming
// answer carries and reach clients apart: each call's deltas under its own tool index, its
// position in the stored calls, opened with its id.
func TestProvider_Stream_SimulatorToolCallsAtIndexZero(t *testing.T) {
	t.Parallel()
	requireSimulatorCallsApart(t, llmsim.Config{ToolCalls: 3, StreamToolCallsAtIndexZero: true})
}

// TestProvider_Stream_SimulatorToolCallsFromIndexOne proves against the simulator that tool calls
// a server numbers from 1 (llmsim's StreamToolCallsFromIndex, as proxies that number calls by
// Anthropic's content blocks send them) are stored from the first place, and reach clients
// under the tool index of their place in the stored calls.
func TestProvider_Stream_SimulatorToolCallsFromIndexOne(t *testing.T) {
	t.Parallel()
	requireSimulatorCallsApart(t, llmsim.Config{ToolCalls: 3, StreamToolCallsFromIndex: 1})
}

// TestProvider_Stream_SimulatorToolNamesAtAnotherIndex proves against the simulator that tool
// calls whose names a server streams at one index and whose arguments at another, each piece
// under an id of its own (llmsim's StreamToolNamesAtIndex, as SGLang 0.4.6 sent them), are
// stored as the calls a non-streaming answer carries, each with its name and its arguments, and
// reach clients under the tool index of their place in the stored calls.
func TestProvider_Stream_SimulatorToolNamesAtAnotherIndex(t *testing.T) {
	t.Parallel()
	requireSimulatorCallsApart(t, llmsim.Config{ToolCalls: 3, StreamToolNamesAtIndex: 1})
}

// TestProvider_Stream_SimulatorToolHeadersFirst proves against the simulator that parallel tool
// calls whose headers (id and name) a server streams all at index 0 before any arguments, and
// whose arguments at 1, 2... without id or name (llmsim's StreamToolHeadersFirst, as OmniRoute's
// Responses-to-Chat translator sent them), are stored as the calls a non-streaming answer
// carries, each with its arguments, and reach clients under the tool index of their place.
func TestProvider_Stream_SimulatorToolHeadersFirst(t *testing.T) {
	t.Parallel()
	requireSimulatorCallsApart(t, llmsim.Config{ToolCalls: 3, StreamToolHeadersFirst: true})
}

// requireSimulatorCallsApart streams an answer with cfg.ToolCalls calls from the simulator
// configured with cfg, and requires the calls stored as the non-streaming answer carries them,
// each call's deltas under the tool index of its place in them, opened with its id.
func requireSimulatorCallsApart(t *testing.T, cfg llmsim.Config) {
	t.Helper()
	p, _ := simProvider(t, llm.KindOpenAI, cfg)
	var m map[string]any
	require.NoError(t, json.Unmarshal(streamBody(llm.KindOpenAI), &m))
	m["tools"] = json.RawMessage(`[{"type":"function","function":{"name":"record"}}]`)
	body, err := json.Marshal(m)
	require.NoError(t, err)
	var got deltas
	resp, err := p.Send(t.Context(), body, llm.SendOptions{OnDelta: got.add})
	require.NoError(t, err)
	var out struct {
		Choices []struct {
			Message struct {
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(resp.Body, &out))
	calls := out.Choices[0].Message.ToolCalls
	require.Len(t, calls, cfg.ToolCalls)
	ids := map[int]string{}
	args := map[int]string{}
	for _, d := range got.all {
		if d.Type != llm.DeltaInputJSON {
			continue
		}
		if d.ToolID != "" {
			ids[d.ToolIndex] = d.ToolID
		}
		args[d.ToolIndex] += d.Text
	}
	const want = `{"reply":"llmsim reply to: hello from the prompt"}`
	for i, c := range calls {
		require.Equal(t, "record", c.Function.Name)
		require.JSONEq(t, want, c.Function.Arguments)
		require.Equal(t, c.ID, ids[i], "call %d opened under its own tool index", i)
		require.Equal(t, c.Function.Arguments, args[i])
	}
	require.Len(t, ids, cfg.ToolCalls)
	require.NotEqual(t, calls[0].ID, calls[1].ID)
}

// A body delimited by the connection's close (no chunking) that ends inside an event's line is a
// cut stream, a network error that is retried, like a cut chunked body; not an undecodable
// answer, which fails the job for good.
func TestStream_CutInsideAnEventLineIsANetworkError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind llm.Kind
		body string
	}{
		{llm.KindAnthropic, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[]}}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hel"},
		{llm.KindOpenAI, "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
			"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"the"},
	} {
		t.Run(string(tc.kind), func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.kind, func(w http.ResponseWriter, _ *http.Request) {
				conn, buf, err := http.NewResponseController(w).Hijack()
				require.NoError(t, err)
				defer conn.Close()
				_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + tc.body)
				_ = buf.Flush()
			})
			_, err := b.provider.Send(t.Context(), streamBody(tc.kind), llm.SendOptions{})
			require.Equal(t, retrypolicy.ClassNetwork, retrypolicy.Classify(err, testNow).Class, "err: %v", err)
		})
	}
}

// Citations arrive as citations_delta events of their text block: the stored message carries
// them as a non-streaming answer does.
func TestStream_AnthropicCitationsKept(t *testing.T) {
	t.Parallel()
	b := setup(t, llm.KindAnthropic, sseHandler([]string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\",\"citations\":[]}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"citations_delta\",\"citation\":{\"type\":\"char_location\",\"cited_text\":\"The grass is green.\",\"document_index\":0,\"document_title\":\"Doc\",\"start_char_index\":0,\"end_char_index\":20}}}",
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"the grass is green\"}}",
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":5}}",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}",
	}))
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindAnthropic), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	var msg struct {
		Content []struct {
			Text      string `json:"text"`
			Citations []struct {
				CitedText string `json:"cited_text"`
			} `json:"citations"`
		} `json:"content"`
	}
	require.NoError(t, json.Unmarshal(resp.Body, &msg))
	require.Len(t, msg.Content, 1)
	require.Equal(t, "the grass is green", msg.Content[0].Text)
	require.Len(t, msg.Content[0].Citations, 1, "body: %s", resp.Body)
	require.Equal(t, "The grass is green.", msg.Content[0].Citations[0].CitedText)
}

// With "logprobs": true each chunk carries its tokens' logprobs: the stored message has them all,
// in order, as a non-streaming answer does.
func TestStream_OpenAILogprobsKept(t *testing.T) {
	t.Parallel()
	chunk := func(choices string) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":7,"model":"g","choices":` + choices + `}`
	}
	b := setup(t, llm.KindOpenAI, sseHandler([]string{
		chunk(`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":{"content":[],"refusal":null},"finish_reason":null}]`),
		chunk(`[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.1,"bytes":[72,105],"top_logprobs":[]}],"refusal":null},"finish_reason":null}]`),
		chunk(`[{"index":0,"delta":{"content":"!"},"logprobs":{"content":[{"token":"!","logprob":-0.2,"bytes":[33],"top_logprobs":[]}],"refusal":null},"finish_reason":null}]`),
		chunk(`[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]`),
		`data: [DONE]`,
	}))
	resp, err := b.provider.Send(t.Context(), streamBody(llm.KindOpenAI), llm.SendOptions{})
	require.NoError(t, err)
	defer resp.Release()
	var out struct {
		Choices []struct {
			Logprobs *struct {
				Content []struct{ Token string } `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(resp.Body, &out))
	require.Len(t, out.Choices, 1)
	require.NotNil(t, out.Choices[0].Logprobs, "body: %s", resp.Body)
	require.Equal(t, []struct{ Token string }{{"Hi"}, {"!"}}, out.Choices[0].Logprobs.Content)
}

// splitEvents returns the events of a streamed answer whose text is text, one delta per size
// bytes, in kind's form.
func splitEvents(kind llm.Kind, text string, size int) []string {
	var pieces []string
	for len(text) > 0 {
		n := min(size, len(text))
		pieces = append(pieces, text[:n])
		text = text[n:]
	}
	str := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	if kind == llm.KindOpenAI {
		chunk := func(choices string) string {
			return `data: {"id":"c","object":"chat.completion.chunk","created":7,"model":"g","choices":` + choices + `}`
		}
		events := []string{chunk(`[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]`)}
		for _, p := range pieces {
			events = append(events, chunk(`[{"index":0,"delta":{"content":`+str(p)+`},"finish_reason":null}]`))
		}
		return append(events, chunk(`[{"index":0,"delta":{},"finish_reason":"stop"}]`), `data: [DONE]`)
	}
	events := []string{
		"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"c\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}",
	}
	for _, p := range pieces {
		events = append(events, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":"+str(p)+"}}")
	}
	return append(events,
		"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":9}}",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}")
}

// TestProvider_Stream_KeySplitAcrossDeltasMasked proves that a key the provider echoes split
// across deltas (in any form: as sent, base64; once, or twice in a row) is masked in the deltas
// as in the assembled body, and that the deltas add up to the body's text byte for byte.
func TestProvider_Stream_KeySplitAcrossDeltasMasked(t *testing.T) {
	t.Parallel()
	b64 := base64.StdEncoding.EncodeToString([]byte(testKey))
	text := "key " + testKey + ", twice " + testKey + strings.ToUpper(testKey) + ", encoded " + b64 + ", and the end: s"
	for _, kind := range []llm.Kind{llm.KindAnthropic, llm.KindOpenAI} {
		for _, size := range []int{1, 2, 3, 5, 7, 13} {
			t.Run(fmt.Sprintf("%s/%d", kind, size), func(t *testing.T) {
				t.Parallel()
				b := setup(t, kind, sseHandler(splitEvents(kind, text, size)))
				var got deltas
				resp, err := b.provider.Send(t.Context(), streamBody(kind), llm.SendOptions{OnDelta: got.add})
				require.NoError(t, err)
				defer resp.Release()
				var stored string
				if kind == llm.KindAnthropic {
					var m struct {
						Content []struct{ Text string } `json:"content"`
					}
					require.NoError(t, json.Unmarshal(resp.Body, &m))
					stored = m.Content[0].Text
				} else {
					var m struct {
						Choices []struct {
							Message struct{ Content string } `json:"message"`
						} `json:"choices"`
					}
					require.NoError(t, json.Unmarshal(resp.Body, &m))
					stored = m.Choices[0].Message.Content
				}
				streamed := got.text(llm.DeltaText)
				for _, secret := range []string{"0123456789abcdef", b64[4 : len(b64)-4]} {
					require.NotContains(t, strings.ToLower(stored), strings.ToLower(secret), "stored")
					require.NotContains(t, strings.ToLower(streamed), strings.ToLower(secret), "streamed")
				}
				require.Equal(t, stored, streamed, "the deltas add up to the stored text")
				require.True(t, strings.HasSuffix(streamed, "the end: s"), "a held tail is sent at the end")
			})
		}
	}
}
