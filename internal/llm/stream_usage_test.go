package llm_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// A stream that fails partway reports, beside its error, the usage the provider gave before the
// failure: Anthropic's message_start carries the prompt's input tokens (and an output so far),
// which an error event or a cut connection does not take back. The token limiter is settled with
// them, not with an estimate (or nothing). OpenAI sends its usage only in the last chunk: a
// failure before it reports none.
func TestProvider_Stream_FailureKeepsUsage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		kind  llm.Kind
		mode  string
		known bool
	}{
		{"AnthropicErrorEvent", llm.KindAnthropic, llmsim.StreamFailError, true},
		{"AnthropicCut", llm.KindAnthropic, llmsim.StreamFailCut, true},
		{"OpenAIErrorChunk", llm.KindOpenAI, llmsim.StreamFailError, false},
		{"OpenAICut", llm.KindOpenAI, llmsim.StreamFailCut, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, sim := simProvider(t, tc.kind, llmsim.Config{})
			whole, err := p.Send(t.Context(), streamBody(tc.kind), llm.SendOptions{})
			require.NoError(t, err)
			whole.Release()
			require.Positive(t, whole.Usage.InputTokens)

			require.NoError(t, sim.SetFaults(llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 2, StreamFailMode: tc.mode}))
			_, err = p.Send(t.Context(), streamBody(tc.kind), llm.SendOptions{})
			require.Error(t, err)
			u, ok := llm.FailedUsage(err)
			require.Equal(t, tc.known, ok, "usage known beside %v: %+v", err, u)
			if !tc.known {
				require.Zero(t, u)
				return
			}
			require.Equal(t, whole.Usage.InputTokens, u.InputTokens, "the input message_start reported")
			require.Positive(t, u.OutputTokens, "the output message_start reported")
		})
	}
}

// FailedUsage reports nothing for an error that is not a failed stream's.
func TestFailedUsage_OtherErrors(t *testing.T) {
	t.Parallel()
	for _, err := range []error{nil, llm.ErrDecode, &llm.StatusError{StatusCode: 500}, &llm.TransportError{Op: "send request", Err: llm.ErrFirstByteTimeout}} {
		u, ok := llm.FailedUsage(err)
		require.False(t, ok, "%v", err)
		require.Zero(t, u, "%v", err)
	}
}

// A completed stream's output count is the one reported after message_start (Anthropic's
// message_delta; OpenAI's usage chunk, the only one): message_start's output_tokens is a
// placeholder (1) written before any output. A message_delta without a usage, or one whose usage
// has no output_tokens (a gateway's), leaves the output unreported (Usage.OutputUnreported),
// so that the executor keeps it charged; taken as 1, the grant was refunded down to one output
// token, though the answer may have been max_tokens long. An OpenAI stream without its usage
// chunk reports no usage at all (the whole reservation stays charged).
func TestProvider_Stream_OutputReportedOnlyAfterMessageStart(t *testing.T) {
	t.Parallel()
	const start = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",` +
		`"model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":500,"output_tokens":1}}}`
	for _, tc := range []struct {
		name   string
		kind   llm.Kind
		events []string // each an event's data; Anthropic's name is its type
		want   llm.Usage
	}{
		{"AnthropicDeltaWithoutUsage", llm.KindAnthropic, []string{start,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"}}`},
			llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"AnthropicDeltaUsageWithoutOutput", llm.KindAnthropic, []string{start,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":500}}`},
			llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"AnthropicDeltaOutputNull", llm.KindAnthropic, []string{start,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":null}}`},
			llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"AnthropicNoDelta", llm.KindAnthropic, []string{start}, llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"AnthropicDeltaWithOutput", llm.KindAnthropic, []string{start,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}`},
			llm.Usage{InputTokens: 500, OutputTokens: 7}},
		{"AnthropicDeltaWithZeroOutput", llm.KindAnthropic, []string{start,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":0}}`},
			llm.Usage{InputTokens: 500}},
		{"OpenAIWithoutUsageChunk", llm.KindOpenAI, []string{
			`{"id":"c1","object":"chat.completion.chunk","model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":null}]}`,
			`{"id":"c1","object":"chat.completion.chunk","model":"gpt-test","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`},
			llm.Usage{}},
		{"OpenAIUsageWithoutOutput", llm.KindOpenAI, []string{
			`{"id":"c1","object":"chat.completion.chunk","model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`,
			`{"id":"c1","object":"chat.completion.chunk","model":"gpt-test","choices":[],"usage":{"prompt_tokens":500}}`},
			llm.Usage{InputTokens: 500, OutputUnreported: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, tc.kind, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for _, data := range tc.events {
					if tc.kind == llm.KindAnthropic {
						var ev struct{ Type string }
						_ = json.Unmarshal([]byte(data), &ev)
						_, _ = fmt.Fprintf(w, "event: %s\n", ev.Type)
					}
					_, _ = fmt.Fprintf(w, "data: %s\n\n", data)
				}
				if tc.kind == llm.KindAnthropic {
					_, _ = io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
				} else {
					_, _ = io.WriteString(w, "data: [DONE]\n\n")
				}
			})
			resp, err := b.provider.Send(callContext(t), streamBody(tc.kind), llm.SendOptions{})
			require.NoError(t, err)
			t.Cleanup(resp.Release)
			require.Equal(t, tc.want, resp.Usage)
		})
	}
}
