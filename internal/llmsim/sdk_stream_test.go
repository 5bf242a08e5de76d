package llmsim_test

import (
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// These tests read the simulator's streams with the official SDKs' own stream readers and
// accumulators, as a user of either SDK would.

func TestSDK_AnthropicStream(t *testing.T) {
	t.Parallel()

	t.Run("Message", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		stream := b.anthropicClient("sk-ant-test").Messages.NewStreaming(t.Context(), anthropicHello)
		defer stream.Close()
		var msg anthropic.Message
		var types []string
		var text strings.Builder
		for stream.Next() {
			ev := stream.Current()
			types = append(types, ev.Type)
			require.NoError(t, msg.Accumulate(ev))
			if d, ok := ev.AsAny().(anthropic.ContentBlockDeltaEvent); ok {
				text.WriteString(d.Delta.Text)
			}
		}
		require.NoError(t, stream.Err())
		require.Equal(t, "message_start", types[0])
		require.Equal(t, "message_stop", types[len(types)-1])
		require.Contains(t, types, "message_delta")
		require.Greater(t, strings.Count(strings.Join(types, ","), "content_block_delta"), 1, "one delta per token")
		require.True(t, strings.HasPrefix(msg.ID, "msg_"), msg.ID)
		require.Len(t, msg.Content, 1)
		require.Equal(t, "llmsim reply to: Hello, simulator!", msg.Content[0].Text)
		require.Equal(t, msg.Content[0].Text, text.String())
		require.Equal(t, anthropic.StopReasonEndTurn, msg.StopReason)
		require.Equal(t, int64(4), msg.Usage.InputTokens)
		require.Equal(t, int64(8), msg.Usage.OutputTokens)
	})

	t.Run("SameAsNonStreaming", func(t *testing.T) {
		t.Parallel()
		whole, msg, _ := anthropicWholeAndStreamed(t, setup(t, llmsim.Config{ReplyTokens: 30}), anthropicHello)
		require.Equal(t, whole.Content[0].Text, msg.Content[0].Text)
		require.Equal(t, whole.Usage.OutputTokens, msg.Usage.OutputTokens)
		require.Equal(t, whole.StopReason, msg.StopReason)
	})

	t.Run("OverloadedMidStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"stream_fail_next":1,"stream_fail_after":3}`)
		stream := b.anthropicClient("k").Messages.NewStreaming(t.Context(), anthropicHello)
		defer stream.Close()
		deltas := 0
		for stream.Next() {
			if stream.Current().Type == "content_block_delta" {
				deltas++
			}
		}
		require.Equal(t, 3, deltas)
		var apiErr *anthropic.Error
		require.ErrorAs(t, stream.Err(), &apiErr)
		require.Equal(t, "overloaded_error", string(apiErr.Type()))
		require.Zero(t, b.sim.Faults().StreamFailNext, "the fault counts down")

		again := b.anthropicClient("k").Messages.NewStreaming(t.Context(), anthropicHello)
		defer again.Close()
		for again.Next() {
		}
		require.NoError(t, again.Err(), "only the next stream fails")
	})

	t.Run("CutMidStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		require.NoError(t, b.sim.SetFaults(llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 2, StreamFailMode: llmsim.StreamFailCut}))
		stream := b.anthropicClient("k").Messages.NewStreaming(t.Context(), anthropicHello)
		defer stream.Close()
		var types []string
		for stream.Next() {
			types = append(types, stream.Current().Type)
		}
		require.NotContains(t, types, "message_stop")
		var apiErr *anthropic.Error
		require.NotErrorAs(t, stream.Err(), &apiErr, "a cut is no API error")
		require.Error(t, stream.Err(), "a cut connection is an error, not a short message")
	})
}

func TestSDK_OpenAIStream(t *testing.T) {
	t.Parallel()

	t.Run("ChatCompletionWithUsage", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		params := openaiHello
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := b.openaiClient("sk-test").Chat.Completions.NewStreaming(t.Context(), params)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for stream.Next() {
			chunks++
			require.True(t, acc.AddChunk(stream.Current()))
		}
		require.NoError(t, stream.Err())
		require.Greater(t, chunks, 3)
		require.True(t, strings.HasPrefix(acc.ID, "chatcmpl-"), acc.ID)
		require.Len(t, acc.Choices, 1)
		require.Equal(t, "llmsim reply to: Hello, simulator!", acc.Choices[0].Message.Content)
		require.Equal(t, "stop", acc.Choices[0].FinishReason)
		require.Equal(t, int64(4), acc.Usage.PromptTokens)
		require.Equal(t, int64(8), acc.Usage.CompletionTokens)
		require.Equal(t, int64(12), acc.Usage.TotalTokens)
	})

	t.Run("NoUsageUnlessAsked", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		stream := b.openaiClient("sk-test").Chat.Completions.NewStreaming(t.Context(), openaiHello)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			require.NotContains(t, stream.Current().RawJSON(), `"usage"`)
			acc.AddChunk(stream.Current())
		}
		require.NoError(t, stream.Err())
		require.Zero(t, acc.Usage.TotalTokens)
		require.Equal(t, "llmsim reply to: Hello, simulator!", acc.Choices[0].Message.Content)
	})

	t.Run("ErrorMidStream", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		b.setFaults(t, `{"stream_fail_next":1,"stream_fail_after":2}`)
		stream := b.openaiClient("sk-test").Chat.Completions.NewStreaming(t.Context(), openaiHello)
		defer stream.Close()
		var content strings.Builder
		for stream.Next() {
			if ch := stream.Current().Choices; len(ch) > 0 {
				content.WriteString(ch[0].Delta.Content)
			}
		}
		require.ErrorContains(t, stream.Err(), "server_error")
		require.Equal(t, "llmsim r", content.String(), "two tokens of four bytes came first")
	})
}

// TestSDK_ToolStreams proves that a request with tools is answered with a call of the first
// tool after the text, streamed as the APIs stream it (Anthropic input_json_delta pieces, OpenAI
// tool call chunks), and that the SDKs' accumulators assemble the call the non-streaming answer
// carries.
func TestSDK_ToolStreams(t *testing.T) {
	t.Parallel()

	t.Run("Anthropic", func(t *testing.T) {
		t.Parallel()
		whole, msg, jsonDeltas := anthropicWholeAndStreamed(t, setup(t, llmsim.Config{}), anthropicRecordParams())
		require.Greater(t, jsonDeltas, 1, "the input comes in pieces")
		require.Equal(t, anthropic.StopReasonToolUse, msg.StopReason)
		require.Len(t, msg.Content, 2)
		require.Equal(t, "tool_use", msg.Content[1].Type)
		require.Equal(t, "record", msg.Content[1].Name)
		require.True(t, strings.HasPrefix(msg.Content[1].ID, "toolu_"))
		require.JSONEq(t, `{"reply":"llmsim reply to: Hello, simulator!"}`, string(msg.Content[1].Input))
		require.JSONEq(t, string(whole.Content[1].Input), string(msg.Content[1].Input))
		require.Equal(t, whole.StopReason, msg.StopReason)
	})

	t.Run("OpenAI", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{})
		params := openaiRecordParams()
		client := b.openaiClient("sk-test")
		whole, err := client.Chat.Completions.New(t.Context(), params)
		require.NoError(t, err)
		stream := client.Chat.Completions.NewStreaming(t.Context(), params)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		var finished []openai.FinishedChatCompletionToolCall
		for stream.Next() {
			require.True(t, acc.AddChunk(stream.Current()))
			if tc, ok := acc.JustFinishedToolCall(); ok {
				finished = append(finished, tc)
			}
		}
		require.NoError(t, stream.Err())
		require.Equal(t, "tool_calls", acc.Choices[0].FinishReason)
		require.Len(t, acc.Choices[0].Message.ToolCalls, 1)
		call := acc.Choices[0].Message.ToolCalls[0]
		require.Equal(t, "record", call.Function.Name)
		require.True(t, strings.HasPrefix(call.ID, "call_"))
		require.JSONEq(t, `{"reply":"llmsim reply to: Hello, simulator!"}`, call.Function.Arguments)
		require.Len(t, finished, 1)
		require.Equal(t, whole.Choices[0].Message.ToolCalls[0].Function.Arguments, call.Function.Arguments)
		require.Equal(t, whole.Choices[0].Message.Content, acc.Choices[0].Message.Content)
	})
}

// TestSDK_ParallelToolCalls proves that Config.ToolCalls answers a request with tools with that
// many calls of its first tool, each with its own id, which the SDKs' accumulators assemble from
// the streams as the non-streaming answers carry them (ids apart: each answer has its own); that StreamToolCallsAtIndexZero
// streams each OpenAI call whole at index 0, as Ollama does; and that StreamToolCallsFromIndex
// numbers OpenAI's calls from its index, as proxies that number them by Anthropic's content
// blocks do.
func TestSDK_ParallelToolCalls(t *testing.T) {
	t.Parallel()
	const input = `{"reply":"llmsim reply to: Hello, simulator!"}`

	t.Run("Anthropic", func(t *testing.T) {
		t.Parallel()
		whole, msg, _ := anthropicWholeAndStreamed(t, setup(t, llmsim.Config{ToolCalls: 2}), anthropicRecordParams())
		require.Len(t, whole.Content, 3)
		require.Len(t, msg.Content, 3)
		require.NotEqual(t, msg.Content[1].ID, msg.Content[2].ID)
		for i := 1; i <= 2; i++ {
			require.Equal(t, "tool_use", msg.Content[i].Type)
			require.Equal(t, "tool_use", whole.Content[i].Type)
			require.True(t, strings.HasPrefix(msg.Content[i].ID, "toolu_"))
			require.JSONEq(t, input, string(msg.Content[i].Input))
		}
	})

	t.Run("OpenAI", func(t *testing.T) {
		t.Parallel()
		b := setup(t, llmsim.Config{ToolCalls: 2})
		params := openaiRecordParams()
		client := b.openaiClient("sk-test")
		whole, err := client.Chat.Completions.New(t.Context(), params)
		require.NoError(t, err)
		stream := client.Chat.Completions.NewStreaming(t.Context(), params)
		defer stream.Close()
		var acc openai.ChatCompletionAccumulator
		for stream.Next() {
			require.True(t, acc.AddChunk(stream.Current()))
		}
		require.NoError(t, stream.Err())
		calls := acc.Choices[0].Message.ToolCalls
		require.Len(t, whole.Choices[0].Message.ToolCalls, 2)
		require.Len(t, calls, 2)
		require.NotEqual(t, calls[0].ID, calls[1].ID)
		require.NotEqual(t, whole.Choices[0].Message.ToolCalls[0].ID, whole.Choices[0].Message.ToolCalls[1].ID)
		for _, call := range calls {
			require.True(t, strings.HasPrefix(call.ID, "call_"))
			require.JSONEq(t, input, call.Function.Arguments)
		}
	})

	t.Run("OpenAIAtIndexZero", func(t *testing.T) {
		t.Parallel()
		var ids []string
		for _, tc := range streamedToolCalls(t, setup(t, llmsim.Config{ToolCalls: 2, StreamToolCallsAtIndexZero: true})) {
			require.Zero(t, tc.Index)
			require.NotEmpty(t, tc.ID, "each piece is a whole call")
			require.Equal(t, "record", tc.Function.Name)
			require.JSONEq(t, input, tc.Function.Arguments)
			ids = append(ids, tc.ID)
		}
		require.Len(t, ids, 2)
		require.NotEqual(t, ids[0], ids[1])
	})

	t.Run("OpenAIFromIndexOne", func(t *testing.T) {
		t.Parallel()
		ids, args := map[int64]string{}, map[int64]string{}
		for _, tc := range streamedToolCalls(t, setup(t, llmsim.Config{ToolCalls: 2, StreamToolCallsFromIndex: 1})) {
			if tc.ID != "" {
				require.Empty(t, ids[tc.Index], "one id per index")
				ids[tc.Index] = tc.ID
			}
			args[tc.Index] += tc.Function.Arguments
		}
		require.Len(t, ids, 2)
		require.NotEmpty(t, ids[1])
		require.NotEmpty(t, ids[2])
		require.NotEqual(t, ids[1], ids[2])
		require.JSONEq(t, input, args[1])
		require.JSONEq(t, input, args[2])
	})
}

// openaiRecordParams is openaiHello with the function tool "record", whose calls
// Config.ToolCalls answers with.
func openaiRecordParams() openai.ChatCompletionNewParams {
	params := openaiHello
	params.Tools = []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{Name: "record"})}
	return params
}

// streamedToolCalls streams openaiRecordParams from b's simulator through the OpenAI SDK and
// returns the tool-call pieces of every chunk, in the order they came.
func streamedToolCalls(t *testing.T, b *testBundle) []openai.ChatCompletionChunkChoiceDeltaToolCall {
	t.Helper()
	stream := b.openaiClient("sk-test").Chat.Completions.NewStreaming(t.Context(), openaiRecordParams())
	defer stream.Close()
	var pieces []openai.ChatCompletionChunkChoiceDeltaToolCall
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			pieces = append(pieces, ch.Delta.ToolCalls...)
		}
	}
	require.NoError(t, stream.Err())
	return pieces
}

// anthropicRecordParams is anthropicHello with the tool "record" (its input a reply string),
// whose calls Config.ToolCalls answers with.
func anthropicRecordParams() anthropic.MessageNewParams {
	params := anthropicHello
	params.Tools = []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "record",
		InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"reply": map[string]any{"type": "string"}}}}}}
	return params
}

// anthropicWholeAndStreamed sends params to b's simulator through the Anthropic SDK twice, as a
// message and as a stream, and returns the message, the one the SDK's accumulator built from the
// stream, and how many input_json_delta events the stream had.
func anthropicWholeAndStreamed(t *testing.T, b *testBundle, params anthropic.MessageNewParams) (whole *anthropic.Message, msg anthropic.Message, jsonDeltas int) {
	t.Helper()
	client := b.anthropicClient("k")
	whole, err := client.Messages.New(t.Context(), params)
	require.NoError(t, err)
	stream := client.Messages.NewStreaming(t.Context(), params)
	defer stream.Close()
	for stream.Next() {
		ev := stream.Current()
		require.NoError(t, msg.Accumulate(ev))
		if d, ok := ev.AsAny().(anthropic.ContentBlockDeltaEvent); ok && d.Delta.Type == "input_json_delta" {
			jsonDeltas++
		}
	}
	require.NoError(t, stream.Err())
	return whole, msg, jsonDeltas
}
