package llmsim_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// TestServer_StreamToolNamesAtIndex: with Config.StreamToolNamesAtIndex, each OpenAI tool call's
// name comes at that index and its arguments at index 0 with an empty name, every piece under an
// id no other piece has, as SGLang 0.4.6 sent them; a call's arguments, joined, are its input.
func TestServer_StreamToolNamesAtIndex(t *testing.T) {
	t.Parallel()
	const input = `{"reply":"llmsim reply to: hi"}`
	for name, cfg := range map[string]llmsim.Config{
		"Pieces": {ToolCalls: 2, StreamToolNamesAtIndex: 1},
		"Whole":  {ToolCalls: 2, StreamToolNamesAtIndex: 1, StreamToolInputWhole: true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, cfg)
			r := b.openai(t, "k", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],`+
				`"tools":[{"type":"function","function":{"name":"record"}}]}`)
			require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
			ids := map[string]bool{}
			var args []string // per call, joined
			for _, tc := range toolCallPieces(t, r.body) {
				require.NotEmpty(t, tc.ID)
				require.False(t, ids[tc.ID], "id %s on two pieces", tc.ID)
				ids[tc.ID] = true
				if tc.Function.Name != "" {
					require.Equal(t, "record", tc.Function.Name)
					require.Equal(t, 1, tc.Index, "a name at the index of StreamToolNamesAtIndex")
					require.Empty(t, tc.Function.Arguments)
					args = append(args, "")
					continue
				}
				require.Zero(t, tc.Index, "arguments at index 0")
				require.NotEmpty(t, args, "arguments after a name")
				args[len(args)-1] += tc.Function.Arguments
			}
			require.Len(t, args, 2)
			for _, a := range args {
				require.JSONEq(t, input, a)
			}
		})
	}
}

// TestConfig_StreamToolNamesAtIndexNotNegative: a negative StreamToolNamesAtIndex is refused.
func TestConfig_StreamToolNamesAtIndexNotNegative(t *testing.T) {
	t.Parallel()
	require.EqualError(t, llmsim.Config{StreamToolNamesAtIndex: -1}.Validate(),
		"stream_tool_names_at_index: must not be negative")
}

// TestServer_StreamToolHeadersFirst: with Config.StreamToolHeadersFirst, every OpenAI tool call's
// id and name come at index 0 before any arguments, then each call's whole arguments, without id
// or name, at index 1, 2..., as OmniRoute's Responses-to-Chat translator sent parallel calls.
func TestServer_StreamToolHeadersFirst(t *testing.T) {
	t.Parallel()
	const input = `{"reply":"llmsim reply to: hi"}`
	b := setup(t, llmsim.Config{ToolCalls: 2, StreamToolHeadersFirst: true})
	r := b.openai(t, "k", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}],`+
		`"tools":[{"type":"function","function":{"name":"record"}}]}`)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	pieces := toolCallPieces(t, r.body)
	require.Len(t, pieces, 4)
	for i, p := range pieces[:2] {
		require.Zero(t, p.Index, "header %d at index 0", i)
		require.NotEmpty(t, p.ID)
		require.Equal(t, "record", p.Function.Name)
		require.Empty(t, p.Function.Arguments)
	}
	require.NotEqual(t, pieces[0].ID, pieces[1].ID)
	for i, p := range pieces[2:] {
		require.Equal(t, i+1, p.Index, "arguments of call %d", i)
		require.Empty(t, p.ID)
		require.Empty(t, p.Function.Name)
		require.JSONEq(t, input, p.Function.Arguments)
	}
}

// toolPiece is one tool-call piece of an OpenAI stream's chunk.
type toolPiece struct {
	Index    int    `json:"index"`
	ID       string `json:"id"`
	Function struct{ Name, Arguments string }
}

// toolCallPieces returns the tool-call pieces of an OpenAI SSE body, in the order they came.
func toolCallPieces(t *testing.T, body []byte) []toolPiece {
	t.Helper()
	var pieces []toolPiece
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					ToolCalls []toolPiece `json:"tool_calls"`
				} `json:"delta"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &chunk))
		for _, ch := range chunk.Choices {
			pieces = append(pieces, ch.Delta.ToolCalls...)
		}
	}
	require.NoError(t, sc.Err())
	return pieces
}
