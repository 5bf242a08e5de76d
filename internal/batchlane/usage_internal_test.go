package batchlane

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A batch result's usage is stored in the online lane's form, Anthropic's prompt-cache counts
// with it when it has them.
func TestUsageOf_OnlineLaneForm(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"usage":{"input_tokens":5,"output_tokens":3}}`:                                                               `{"input_tokens":5,"output_tokens":3}`,
		`{"usage":{"input_tokens":5,"output_tokens":3,"cache_creation_input_tokens":600,"cache_read_input_tokens":7}}`: `{"input_tokens":5,"output_tokens":3,"cache_creation_input_tokens":600,"cache_read_input_tokens":7}`,
		`{"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}`:              `{"input_tokens":9,"output_tokens":2}`,
	} {
		require.JSONEq(t, want, string(usageOf([]byte(body))), body)
	}
	require.Nil(t, usageOf([]byte(`{"id":"msg_1"}`)), "no usage reported")
	require.Nil(t, usageOf([]byte(`{"usage":null}`)), "no usage reported")
}

// A batch result's usage with its output but no input count is stored as the online lane stores
// one (llm's dialects decode a missing input as 0: internal/llm anthropic.usage, openAI.usage),
// keeping the output the provider counted: the batch lane stored no usage at all.
func TestUsageOf_InputUnreportedAsOnline(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"usage":{"output_tokens":3}}`:                              `{"input_tokens":0,"output_tokens":3}`,
		`{"usage":{"completion_tokens":3}}`:                          `{"input_tokens":0,"output_tokens":3}`,
		`{"usage":{"output_tokens":3,"cache_read_input_tokens":40}}`: `{"input_tokens":0,"output_tokens":3,"cache_read_input_tokens":40}`,
	} {
		got := usageOf([]byte(body))
		require.NotNil(t, got, "%s: a usage the online lane stores was dropped", body)
		require.JSONEq(t, want, string(got), body)
	}
}

// A batch result's usage with its input but no output count is stored as the online lane stores
// one (output_unreported, its output_tokens 0: no count), not dropped: the batch lane stored
// none, as if the provider had reported nothing.
func TestUsageOf_OutputUnreported(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		`{"usage":{"input_tokens":5}}`:                        `{"input_tokens":5,"output_tokens":0,"output_unreported":true}`,
		`{"usage":{"input_tokens":5,"output_tokens":null}}`:   `{"input_tokens":5,"output_tokens":0,"output_unreported":true}`,
		`{"usage":{"prompt_tokens":9}}`:                       `{"input_tokens":9,"output_tokens":0,"output_unreported":true}`,
		`{"usage":{"prompt_tokens":9,"completion_tokens":0}}`: `{"input_tokens":9,"output_tokens":0}`,
	} {
		require.JSONEq(t, want, string(usageOf([]byte(body))), body)
	}
}

// A batch result's usage that counts nothing (empty, or all its counts 0: no prompt is 0 tokens)
// is no usage, stored as none as a result without one is, and as the online lane stores both
// (llm.Usage.Reported; executor TestExecutor_AnswerWithoutUsageStoresNone): it was stored as
// 0 input and 0 output tokens, a cost the provider never reported.
func TestUsageOf_NothingCountedIsNone(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"usage":{}}`,
		`{"usage":{"input_tokens":0,"output_tokens":0}}`,
		`{"usage":{"prompt_tokens":0,"completion_tokens":0,"total_tokens":0}}`,
		`{"usage":{"input_tokens":null,"output_tokens":null}}`,
		`{"usage":{"input_tokens":0}}`,
	} {
		require.Nil(t, usageOf([]byte(body)), "%s: nothing counted", body)
	}
}
