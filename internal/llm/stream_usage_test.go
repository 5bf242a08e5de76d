package llm_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
)

// A stream that fails partway reports, beside its error, the usage the provider gave before the
// failure: Anthropic's message_start carries the prompt's input tokens (its output count is a
// placeholder: unreported), which an error event or a cut connection does not take back. The token limiter is settled with
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
			// message_start's output_tokens (1) is a placeholder, and no message_delta came.
			require.Equal(t, llm.Usage{InputTokens: whole.Usage.InputTokens, OutputUnreported: true}, u)
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

// A stream that fails partway reports the output a message_delta gave before the failure, and
// no output when none did: message_start's output_tokens (1) is a placeholder written before any
// output, not a count (the failed attempt's row said 1 output token, and the limiter was settled
// with it). As a completed stream's (TestProvider_Stream_OutputReportedOnlyAfterMessageStart).
func TestProvider_Stream_FailureReportsOutputOnlyAfterMessageStart(t *testing.T) {
	t.Parallel()
	const (
		start = `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant",` +
			`"model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":500,"output_tokens":1}}}`
		block   = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
		text    = `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"ok"}}`
		errorEv = `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`
	)
	for _, tc := range []struct {
		name   string
		events []string
		want   llm.Usage
	}{
		{"ErrorRightAfterMessageStart", []string{start, errorEv}, llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"ErrorAfterText", []string{start, block, text, errorEv}, llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"CutAfterText", []string{start, block, text}, llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"CutRightAfterMessageStart", []string{start}, llm.Usage{InputTokens: 500, OutputUnreported: true}},
		{"ErrorAfterDeltaOutput", []string{start, block, text,
			`{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":5}}`, errorEv},
			llm.Usage{InputTokens: 500, OutputTokens: 5}},
		{"CutAfterDeltaOutput", []string{start, block, text,
			`{"type":"message_delta","delta":{"stop_reason":null},"usage":{"output_tokens":5}}`},
			llm.Usage{InputTokens: 500, OutputTokens: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, llm.KindAnthropic, func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				for _, data := range tc.events {
					var ev struct{ Type string }
					_ = json.Unmarshal([]byte(data), &ev)
					_, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.Type, data)
				}
				// no message_stop: an error event ended the stream, or the connection is cut here
			})
			_, err := b.provider.Send(callContext(t), streamBody(llm.KindAnthropic), llm.SendOptions{})
			require.Error(t, err)
			u, ok := llm.FailedUsage(err)
			require.True(t, ok, "usage known beside %v", err)
			require.Equal(t, tc.want, u, "beside %v", err)
			// A cut stream tells the time to its first delta, when one came: the provider had
			// begun to answer (the attempt's ttfb_ms).
			var te *llm.TransportError
			if errors.As(err, &te) {
				if slices.Contains(tc.events, text) {
					require.Positive(t, te.TimeToFirstByte, "a cut stream's first delta")
				} else {
					require.Zero(t, te.TimeToFirstByte, "no delta came")
				}
			}
		})
	}
}
