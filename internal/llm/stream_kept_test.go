package llm

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// heldBy feeds events to asm and returns the bytes of heap the assembler holds afterwards: the
// live heap after a collection, less what it was before. The events are built before and kept
// alive after, so that they count on neither side.
func heldBy(t *testing.T, asm assembler, events [][2]string) int64 {
	t.Helper()
	var data []byte
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, e := range events {
		data = append(data[:0], e[1]...) // readStream reuses its buffer: the assemblers keep none of it
		_, err := asm.event(e[0], data, func(Delta) {}, func(int) {})
		require.NoError(t, err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(events)
	runtime.KeepAlive(data)
	runtime.KeepAlive(asm)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}

// heapNoise is how far the live heap moves between two reads for reasons not the assembler's (the
// runtime's and the testing package's own allocations): up to ~25 KB seen, against the ~400 KB a
// text's builder capacity held uncounted in 5,000 pieces of 1 KB.
const heapNoise = 64 << 10

// What an assembler counts as kept (against MaxResponseBytes and the answer budget) is at least
// what it holds, whatever the shape of the events: a decoded JSON member or array element holds
// many times its text's bytes when the text is short (a map slot, a slice header, allocations
// rounded up), and a stream of such pieces (many small content blocks, citations, logprobs
// entries, message_delta members) held several times the limit it was checked against.
//
// Not parallel: it measures the process's live heap, which parallel tests would move.
func TestAssemblers_KeptCoversWhatTheyHold(t *testing.T) {
	const n = 5000
	msgStart := [2]string{"message_start", `{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","model":"c","content":[],"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":1}}}`}
	textBlock := [2]string{"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`}
	cases := map[string]struct {
		asm    func() assembler
		events func() [][2]string
	}{
		"AnthropicManyBlocks": {anthropic{}.assembler, func() [][2]string {
			ev := [][2]string{msgStart}
			for i := range n {
				ev = append(ev, [2]string{"content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"text","text":""}}`, i)})
			}
			return ev
		}},
		"AnthropicManyCitations": {anthropic{}.assembler, func() [][2]string {
			ev := [][2]string{msgStart, textBlock}
			for range n {
				ev = append(ev, [2]string{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{}}}`})
			}
			return ev
		}},
		"AnthropicMessageDeltaMembers": {anthropic{}.assembler, func() [][2]string {
			ev := [][2]string{msgStart}
			for i := range n / 1000 {
				var b strings.Builder
				for j := range 1000 {
					fmt.Fprintf(&b, `,"k%d":1`, i*1000+j)
				}
				ev = append(ev, [2]string{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"` + b.String() + `},"usage":{"output_tokens":2}}`})
			}
			return ev
		}},
		// Text pieces grow a strings.Builder, whose spare capacity is held as much as its text.
		"OpenAILongContent": {openAI{}.assembler, func() [][2]string {
			piece := strings.Repeat("x", 1000)
			var ev [][2]string
			for range n {
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{"content":"` + piece + `"},"logprobs":null,"finish_reason":null}]}`})
			}
			return ev
		}},
		"OpenAILongToolArguments": {openAI{}.assembler, func() [][2]string {
			piece := strings.Repeat("x", 1000)
			var ev [][2]string
			for range n {
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"` + piece + `"}}]}}]}`})
			}
			return ev
		}},
		"AnthropicLongText": {anthropic{}.assembler, func() [][2]string {
			piece := strings.Repeat("x", 1000)
			ev := [][2]string{msgStart, textBlock}
			for range n {
				ev = append(ev, [2]string{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + piece + `"}}`})
			}
			return ev
		}},
		"AnthropicLongToolInput": {anthropic{}.assembler, func() [][2]string {
			piece := strings.Repeat("x", 1000)
			ev := [][2]string{msgStart, {"content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}`}}
			for range n {
				ev = append(ev, [2]string{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"` + piece + `"}}`})
			}
			return ev
		}},
		"OpenAISmallLogprobs": {openAI{}.assembler, func() [][2]string {
			entries := "[" + strings.Repeat("{},", 999) + "{}]"
			var ev [][2]string
			for range n / 1000 {
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{},"logprobs":{"content":` + entries + `}}]}`})
			}
			return ev
		}},
		"OpenAILogprobs": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for range n {
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":{"content":[{"token":"Hello","logprob":-0.31725305,"bytes":[72,101,108,108,111],"top_logprobs":[]}],"refusal":null},"finish_reason":null}]}`})
			}
			return ev
		}},
		"OpenAISmallAnnotations": {openAI{}.assembler, func() [][2]string {
			entries := "[" + strings.Repeat("{},", 999) + "{}]"
			var ev [][2]string
			for range n / 1000 {
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{"annotations":` + entries + `}}]}`})
			}
			return ev
		}},
		"AzureManyFilterCategories": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for i := range n / 1000 {
				var b strings.Builder
				for j := range 1000 {
					fmt.Fprintf(&b, `,"c%d":{}`, i*1000+j)
				}
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{},"content_filter_results":{"hate":{}` + b.String() + `}}]}`})
			}
			return ev
		}},
		"OpenAIManyChoices": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for i := range n {
				ev = append(ev, [2]string{"", fmt.Sprintf(`{"id":"c","choices":[{"index":%d,"delta":{}}]}`, i)})
			}
			return ev
		}},
		"OpenAIManyToolCalls": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for i := range n {
				ev = append(ev, [2]string{"", fmt.Sprintf(`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":%d}]}}]}`, i)})
			}
			return ev
		}},
		"OpenAIManyUnindexedToolCalls": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for i := range n {
				ev = append(ev, [2]string{"", fmt.Sprintf(`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"id":"%d"}]}}]}`, i)})
			}
			return ev
		}},
		// Ollama's parallel calls, every one at index 0 with its own id: a call each.
		"OpenAIManyCallsAtOneIndex": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for i := range n {
				ev = append(ev, [2]string{"", fmt.Sprintf(`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":%d,"id":"%d","function":{"name":"f"}}]}}]}`, i%2, i)})
			}
			return ev
		}},
		// Arguments without a name, each at an index of its own, all continuing the one named
		// call (SGLang sent a call's arguments at another index than its name).
		"OpenAIArgumentsAtNewIndexes": {openAI{}.assembler, func() [][2]string {
			ev := [][2]string{{"", `{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f"}}]}}]}`}}
			for i := range n {
				ev = append(ev, [2]string{"", fmt.Sprintf(`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":%d,"function":{"arguments":"x"}}]}}]}`, i+1)})
			}
			return ev
		}},
		// A top-level object merged from chunks that each bring some of its members (SGLang's
		// sglext in ids_framed mode).
		"OpenAILateObjectMerged": {openAI{}.assembler, func() [][2]string {
			ev := [][2]string{{"", `{"id":"c","choices":[]}`}}
			for i := range n {
				ev = append(ev, [2]string{"", fmt.Sprintf(`{"id":"c","choices":[],"sglext":{"k%d":"%s"}}`, i, strings.Repeat("x", 100))})
			}
			return ev
		}},
		"OpenRouterManyReasoningDetails": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for i := range n {
				ev = append(ev, [2]string{"", fmt.Sprintf(`{"id":"c","choices":[{"index":0,"delta":{"reasoning_details":[{"type":"t","text":"","index":%d}]}}]}`, i)})
			}
			return ev
		}},
		"OpenRouterReasoningDetailMembers": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for i := range n / 1000 {
				var b strings.Builder
				for j := range 1000 {
					fmt.Fprintf(&b, `,"k%d":1`, i*1000+j)
				}
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{"reasoning_details":[{"index":0` + b.String() + `}]}}]}`})
			}
			return ev
		}},
		// A server's own choice members (SGLang's matched_stop), each kept in the choice.
		"OpenAIChoiceExtras": {openAI{}.assembler, func() [][2]string {
			var ev [][2]string
			for i := range n / 1000 {
				var b strings.Builder
				for j := range 1000 {
					fmt.Fprintf(&b, `,"k%d":1`, i*1000+j)
				}
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{}` + b.String() + `}]}`})
			}
			return ev
		}},
		// Top-level members the first chunk lacked (SGLang's sglext), each kept in the message;
		// text chunks that carry new ones too.
		"OpenAILateTopMembers": {openAI{}.assembler, func() [][2]string {
			ev := [][2]string{{"", `{"id":"c","choices":[]}`}}
			for i := range n / 1000 {
				var b strings.Builder
				for j := range 1000 {
					fmt.Fprintf(&b, `,"k%d":1`, i*1000+j)
				}
				ev = append(ev, [2]string{"", `{"id":"c","choices":[]` + b.String() + `}`})
				ev = append(ev, [2]string{"", `{"id":"c","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]` + strings.ReplaceAll(b.String(), `"k`, `"t`) + `}`})
			}
			return ev
		}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			asm := c.asm()
			held := heldBy(t, asm, c.events())
			require.GreaterOrEqual(t, asm.kept()+heapNoise, held, "kept %d bytes, held %d", asm.kept(), held)
		})
	}
}

// Reasoning text is kept as content is: each member's pieces count, the two members of a server
// that sends both twice.
func TestOpenAIAssembler_KeptCountsReasoning(t *testing.T) {
	t.Parallel()
	piece := strings.Repeat("x", 10000)
	keptAfter := func(delta string) int64 {
		asm := openAI{}.assembler()
		for _, e := range []string{`{"id":"c","choices":[]}`, // the envelope, which counts whole
			`{"id":"c","choices":[{"index":0,"delta":{` + delta + `}}]}`} {
			_, err := asm.event("", []byte(e), func(Delta) {}, func(int) {})
			require.NoError(t, err)
		}
		return asm.kept()
	}
	base := keptAfter(`"content":""`)
	require.GreaterOrEqual(t, keptAfter(`"reasoning_content":"`+piece+`"`)-base, int64(len(piece)))
	require.GreaterOrEqual(t, keptAfter(`"reasoning":"`+piece+`"`)-base, int64(len(piece)))
	require.GreaterOrEqual(t,
		keptAfter(`"reasoning":"`+piece+`","reasoning_content":"`+piece+`"`)-base, int64(2*len(piece)))
}

// OpenRouter's reasoning_details text counts as kept, once; the members every piece repeats
// (type, format, index, a null signature) count once for their entry, not once a chunk: a long
// reasoning is not refused for bytes it does not keep.
func TestOpenAIAssembler_KeptCountsReasoningDetails(t *testing.T) {
	t.Parallel()
	keptAfter := func(pieces int, text string) int64 {
		asm := openAI{}.assembler()
		_, err := asm.event("", []byte(`{"id":"c","choices":[]}`), func(Delta) {}, func(int) {})
		require.NoError(t, err)
		for range pieces {
			_, err := asm.event("", []byte(`{"id":"c","choices":[{"index":0,"delta":{"reasoning_details":[{"type":"reasoning.text","text":"`+
				text+`","signature":null,"format":"anthropic-claude-v1","index":0}]}}]}`), func(Delta) {}, func(int) {})
			require.NoError(t, err)
		}
		return asm.kept()
	}
	base := keptAfter(1, "")
	piece := strings.Repeat("x", 10000)
	require.GreaterOrEqual(t, keptAfter(1, piece)-base, int64(len(piece)))
	require.Less(t, keptAfter(1001, "xy")-base, int64(1000*2+1000*16), "the text, not its entry again a chunk")
}
