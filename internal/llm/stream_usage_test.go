package llm_test

import (
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
