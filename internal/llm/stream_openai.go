package llm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"sort"
	"strings"

	"github.com/llmq/llmq/internal/jsonscan"
)

// openAIAssembler reads the Chat Completions stream: data-only chat.completion.chunk events whose
// choices carry deltas (role, content, refusal, tool_calls by index with id, name and argument
// pieces, or a custom tool's name and input pieces, or the legacy function_call; annotations;
// compatible servers' reasoning_content or reasoning, OpenRouter's reasoning_details) and a
// finish_reason (and, from Azure, content_filter_results; from OpenRouter, native_finish_reason;
// a server's own members, kept at their last non-null value: SGLang's matched_stop, vLLM's
// stop_reason); a chunk with a non-null usage (stream_options.include_usage); top-level members
// the first chunk did not have (SGLang's sglext), kept at their last non-null value (an object's
// merged member by member); data: [DONE] ends it; a chunk {"error":{...}} fails it.
type openAIAssembler struct {
	top map[string]json.RawMessage // the first chunk's fields, but choices, usage and obfuscation
	// late are the top-level members of later chunks that top lacks or has null (SGLang's sglext,
	// on a chunk of its own near the end, or two), each at its last non-null value, an object
	// merged with the one before (keepLate).
	late    map[string]json.RawMessage
	choices map[int]*openAIChoice
	usage   json.RawMessage
	// topPending: top has no id yet and came from chunks without choices (Azure opens with a
	// prompt_filter_results chunk whose id, model and created are empty): the next decoded chunk
	// fills what top lacks. A chunk with choices ends it, id or not: servers whose chunks have no
	// id (OpenVINO) or an empty one (text-generation-inference) are not decoded twice, nor counted
	// whole, chunk after chunk.
	topPending bool
	n          int64 // kept
}

type openAIChoice struct {
	role       string
	content    strings.Builder
	hasContent bool
	refusal    strings.Builder
	hasRefusal bool
	// reasoning_content (DeepSeek, SGLang, vLLM before its rename) and reasoning (OpenRouter,
	// Ollama, vLLM since): each kept under its own name, as the server's non-streaming answer has
	// it (vLLM sent both for a while). thinkFrom is the one whose pieces go to clients as
	// DeltaThinking: the first that brought text, so that the deltas add up to it once. A member
	// that came only as null (sentReasoning...: a server with a reasoning parser sends it on every
	// delta, null when the model did not reason) is kept null, as the server's non-streaming
	// answer has it.
	reasoningContent     strings.Builder
	hasReasoningContent  bool
	sentReasoningContent bool
	reasoning            strings.Builder
	hasReasoning         bool
	sentReasoning        bool
	thinkFrom            reasoningField
	// details is OpenRouter's reasoning_details, an entry per index in the order they came
	// (detailAt: where an index's entry is).
	details     []*reasoningDetail
	detailAt    map[int]int
	annotations []json.RawMessage
	// filters is Azure's content_filter_results, by category: each at its most severe report
	// (filterRank). hasFilters: a chunk of the choice carried the object, {} included.
	filters    map[string]json.RawMessage
	hasFilters bool
	// tools are the choice's tool calls by the server's index, unless it reused one (toolIndex).
	// A call's place in the message, which clients see as Delta.ToolIndex, is its own (pos).
	tools map[int]*openAITool
	// lastTool is the key in tools of the call the last piece went to, nextTool the one after the
	// highest so far: where a piece without index goes, or one whose index is reused (toolIndex).
	lastTool, nextTool int
	// places are the calls' places in the message (openAITool.pos); nil until a call has one.
	places *toolPlaces
	// movedTools maps an index the server reused for another call (Ollama gives every call index
	// 0), or gave a call's arguments apart from its name (SGLang), to the call the later pieces of
	// that index go to; nil until one is.
	movedTools   map[int]int
	function     *openAITool // the legacy function_call (a request with "functions")
	finishReason json.RawMessage
	// nativeFinish is OpenRouter's native_finish_reason, its last non-null value; hasNative: a
	// chunk of the choice carried the member.
	nativeFinish json.RawMessage
	hasNative    bool
	// sentNullTools: a delta had "tool_calls":null; with no call placed (pieces that brought no
	// call anything store none), the message has it null.
	sentNullTools bool
	// extras are the server's own members of the choice (SGLang's matched_stop, vLLM's
	// stop_reason), each at its last non-null value (keepMember).
	extras map[string]json.RawMessage
	// logprobs (with "logprobs": true): every chunk's content and refusal entries, in order.
	hasLogprobs bool
	logContent  []json.RawMessage
	logRefusal  []json.RawMessage
}

// toolPlaces are a choice's tool calls by their place in the message.
type toolPlaces struct {
	keyAt []int // the key in openAIChoice.tools of the call at each place
	// bare has the bit of each place whose call has a name and no arguments yet: awaitingArgs
	// finds the first from a place on without a scan of the calls (a stream of many calls pays
	// a word per 64 calls for such a piece, not a call).
	bare []uint64
}

type openAITool struct {
	id, typ, name string
	// index is the server's index of the pieces that opened the call, -1 for pieces without one.
	index int
	// pos is the call's place in the message's tool_calls, -1 until a piece brings it something
	// (an id, a name or arguments): calls take the places in the order they first do, so that the
	// message has no empty call and no gap where a server skipped an index or started past 0
	// (proxies that number calls by Anthropic's content blocks), and what clients see of a call
	// comes under the tool index it is stored at.
	pos    int
	args   strings.Builder // the function's arguments, or the custom tool's input
	custom bool            // pieces came as custom (a custom tool), not as function
}

// reasoningField names the delta member a choice's reasoning came in.
type reasoningField int8

const (
	fromReasoningContent reasoningField = iota + 1
	fromReasoning
	fromReasoningDetails
)

// reasoningDetail is one entry of OpenRouter's reasoning_details, merged from the pieces of its
// index: the pieces of its text members (isDetailText) joined, each other member at its
// last non-null value.
type reasoningDetail struct {
	members map[string]json.RawMessage
	texts   map[string]*strings.Builder
}

// isDetailText reports whether k is a member of a reasoning_details entry whose pieces are joined:
// the text of reasoning.text, the summary of reasoning.summary, the data of reasoning.encrypted.
func isDetailText(k string) bool { return k == "text" || k == "summary" || k == "data" }

func (openAI) assembler() assembler { return &openAIAssembler{choices: map[int]*openAIChoice{}} }

type openAIChunkChoice struct {
	Index int `json:"index"`
	Delta struct {
		Role             string    `json:"role"`
		Content          *string   `json:"content"`
		Refusal          *string   `json:"refusal"`
		ReasoningContent deltaText `json:"reasoning_content"`
		Reasoning        deltaText `json:"reasoning"`
		ReasoningDetails deltaList `json:"reasoning_details"`
		Annotations      deltaList `json:"annotations"`
		FunctionCall     *struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function_call"`
		ToolCalls []struct {
			Index    *int   `json:"index"` // Gemini's parallel calls have none
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
			Custom deltaCustom `json:"custom"`
		} `json:"tool_calls"`
	} `json:"delta"`
	Logprobs *struct {
		Content []json.RawMessage `json:"content"`
		Refusal []json.RawMessage `json:"refusal"`
	} `json:"logprobs"`
	FinishReason json.RawMessage `json:"finish_reason"`
	// NativeFinishReason: OpenRouter's, the upstream provider's own finish reason.
	NativeFinishReason json.RawMessage `json:"native_finish_reason"`
	// ContentFilterResults: Azure's, by category (hate, violence, protected_material_text...).
	// The content_filter_offsets beside them (Asynchronous Filter: the rated segment's place in the
	// streamed text) are not read: a non-streaming choice has none, and they would misdescribe
	// the results kept, which merge every segment's.
	ContentFilterResults deltaObject `json:"content_filter_results"`
}

// openAIChoiceMembers are the members of a chunk's choice that openAIChunkChoice reads, or leaves
// out on purpose (content_filter_offsets): not a server's own (readRaw).
var openAIChoiceMembers = []string{"index", "delta", "logprobs", "finish_reason",
	"native_finish_reason", "content_filter_results", "content_filter_offsets"}

// readRaw takes from the chunk data (valid JSON, decoded as ch) what decoding does not give, into
// each of its choices: a delta's "tool_calls":null (SGLang sends it on every delta of an answer
// without tool calls; decoded, it is no tool call), and the members of the choice that
// openAIChunkChoice does not read: a server's own (SGLang's matched_stop, vLLM's stop_reason),
// which its non-streaming choice has at its last chunk's value. Each is kept at its last non-null
// value (keepMember). A member whose value is a list is not: a stream's list member is a piece per
// chunk (vLLM's token_ids), whose last is not the non-streaming choice's list. It reads data
// without decoding it again and allocates only for a member it keeps, so that a server sending
// one on every chunk (SGLang's "matched_stop":null) does not cost each chunk a map.
//
// later: the chunk is not the one top was taken from (setTop), so that its top-level members
// that top lacks are kept too (keepLate).
func (a *openAIAssembler) readRaw(data []byte, ch *openAIChunk, later bool) {
	var choices []byte
	topLevelMembers(data, func(key, value []byte) bool {
		if jsonKeyIs(key, "choices") {
			choices = value // decoding keeps the last
		} else if later {
			a.keepLate(key, value)
		}
		return true
	})
	i := 0
	arrayElements(choices, func(elem []byte) bool {
		if i >= len(ch.Choices) {
			return false
		}
		c := a.choices[ch.Choices[i].Index]
		i++
		topLevelMembers(elem, func(key, value []byte) bool {
			if jsonKeyIs(key, "delta") {
				c.sentNullTools = c.sentNullTools || nullToolCalls(value)
				return true
			}
			if value[0] == '[' || slices.ContainsFunc(openAIChoiceMembers, func(m string) bool {
				return jsonKeyIs(key, m)
			}) {
				return true
			}
			if _, had := c.extras[string(key)]; had && string(value) == "null" {
				return true // what keepMember would do, without allocating the key
			}
			k := string(key)
			if bytes.IndexByte(key, '\\') >= 0 && json.Unmarshal(quote(key), &k) != nil {
				return true // not a key decoding reads
			}
			if c.extras == nil {
				c.extras = map[string]json.RawMessage{}
			}
			a.n += keepMember(c.extras, k, bytes.Clone(value))
			return true
		})
		return true
	})
}

// keepLate keeps the top-level member key (between its quotes, undecoded) of a chunk after the
// first at value (valid JSON), merged into the value kept when both are objects (mergeObject),
// when takesLate says the message takes it, counting what it keeps.
func (a *openAIAssembler) keepLate(key, value []byte) {
	if bytes.IndexByte(key, '\\') >= 0 { // rare: decoded, as decoding reads it
		var k string
		if json.Unmarshal(quote(key), &k) != nil {
			return
		}
		key = []byte(k)
	}
	if !a.takesLate(key, value) {
		return
	}
	if a.late == nil {
		a.late = map[string]json.RawMessage{}
	}
	a.n += keepMember(a.late, string(key), mergeObject(a.late[string(key)], value))
}

// mergeObject returns a copy of next, a member's value (valid JSON), as it replaces cur, the value
// kept so far: when both are objects, next's members after those of cur's that next lacks or has
// null (SGLang's ids_framed mode sends sglext in two chunks, each with some of its members), so
// that the value kept is the members' union, each at its last non-null value. A
// value that is not an object, or an object kept with more than maxMergedMembers members, replaces
// cur whole: merging is for a few chunks that split one object, and a stream that brought a new
// member on every chunk would have each chunk copy all it kept. It reads each object once, then
// next again to copy it (cur's members held on the stack, next's looked up among them), and
// allocates the copy only; keys that escape characters are compared decoded.
func mergeObject(cur, next json.RawMessage) json.RawMessage {
	if len(cur) == 0 || cur[0] != '{' || len(next) == 0 || next[0] != '{' {
		return bytes.Clone(next)
	}
	// cur's non-null members; kept: next lacks it or has it null (decoding keeps the last).
	var held [maxMergedMembers]curMember
	members, n := 0, 0
	topLevelMembers(cur, func(key, value []byte) bool {
		if members++; members > maxMergedMembers {
			return false
		}
		if string(value) != "null" {
			held[n] = curMember{key: key, value: value, kept: true}
			n++
		}
		return true
	})
	if members > maxMergedMembers {
		return bytes.Clone(next)
	}
	curMembers := held[:n]
	topLevelMembers(next, func(key, value []byte) bool {
		for i := range curMembers {
			if sameKey(curMembers[i].key, key) {
				curMembers[i].kept = string(value) == "null"
			}
		}
		return true
	})
	if !slices.ContainsFunc(curMembers, func(m curMember) bool { return m.kept }) {
		return bytes.Clone(next)
	}
	out := make([]byte, 0, len(cur)+len(next))
	out = append(out, '{')
	member := func(key, value []byte) {
		out = append(append(append(append(out, '"'), key...), `":`...), value...)
		out = append(out, ',')
	}
	for _, m := range curMembers { // first: the members in the order they came
		if m.kept {
			member(m.key, m.value)
		}
	}
	topLevelMembers(next, func(key, value []byte) bool {
		if string(value) != "null" || !slices.ContainsFunc(curMembers, func(m curMember) bool { return m.kept && sameKey(m.key, key) }) {
			member(key, value) // a null of cur's kept members is not: cur's value stands
		}
		return true
	})
	out[len(out)-1] = '}'
	return out
}

// curMember is a member of the object mergeObject merges into (key between its quotes,
// undecoded); kept: the merged object has it.
type curMember struct {
	key, value []byte
	kept       bool
}

// maxMergedMembers bounds the members of a kept object that mergeObject merges a later value into:
// SGLang's sglext has five.
const maxMergedMembers = 64

// sameKey reports whether the keys a and b (between their quotes, undecoded) decode to the same
// key.
func sameKey(a, b []byte) bool {
	if bytes.IndexByte(a, '\\') < 0 && bytes.IndexByte(b, '\\') < 0 {
		return bytes.Equal(a, b)
	}
	var ka, kb string
	return json.Unmarshal(quote(a), &ka) == nil && json.Unmarshal(quote(b), &kb) == nil && ka == kb
}

// takesLate reports whether the top-level member key (decoded) of a chunk after the first, at
// value (valid JSON), changes the stored message: a member the first chunk did not have, or had
// null (the first chunk's values are the message's: SGLang's created is each chunk's time), at a
// non-null value other than the one kept. Not choices, usage, error nor obfuscation, which are
// not members of the message (setTop), nor a list: in a stream a list member is a piece per chunk
// (as readRaw's choice members). It allocates nothing.
func (a *openAIAssembler) takesLate(key, value []byte) bool {
	if string(value) == "null" || value[0] == '[' {
		return false
	}
	if cur, ok := a.top[string(key)]; ok && string(cur) != "null" {
		return false // the first chunk's: most members of most chunks
	}
	if cur, ok := a.late[string(key)]; ok && bytes.Equal(cur, value) {
		return false
	}
	for _, m := range [...]string{"choices", "usage", "error", "obfuscation"} {
		if strings.EqualFold(string(key), m) {
			return false
		}
	}
	return true
}

// nullToolCalls reports whether the delta delta (valid JSON) has "tool_calls":null, as decoding
// reads it (its last tool_calls member).
func nullToolCalls(delta []byte) bool {
	null := false
	topLevelMembers(delta, func(key, value []byte) bool {
		if jsonKeyIs(key, "tool_calls") {
			null = string(value) == "null"
		}
		return true
	})
	return null
}

// jsonKeyIs reports whether the key key (between its quotes, undecoded) is one decoding matches
// to the field name: unescaped, case-insensitively.
func jsonKeyIs(key []byte, name string) bool {
	if bytes.IndexByte(key, '\\') < 0 {
		return strings.EqualFold(string(key), name)
	}
	var k string
	return json.Unmarshal(quote(key), &k) == nil && strings.EqualFold(k, name)
}

// quote returns key between quotes.
func quote(key []byte) []byte { return append(append([]byte{'"'}, key...), '"') }

// arrayElements calls f with each element of the JSON array data (valid JSON) in order. It stops
// when f does, or when data is not an array.
func arrayElements(data []byte, f func(elem []byte) bool) {
	p := bytes.TrimSpace(data)
	if len(p) < 2 || p[0] != '[' {
		return
	}
	p = p[1:]
	for {
		p = bytes.TrimLeft(p, " \t\r\n")
		if len(p) > 0 && p[0] == ',' {
			p = bytes.TrimLeft(p[1:], " \t\r\n")
		}
		if len(p) == 0 || p[0] == ']' {
			return
		}
		end := jsonscan.ValueEnd(p, 0)
		if end == 0 || !f(p[:end]) {
			return
		}
		p = p[end:]
	}
}

// deltaText is a delta member read as text when it is a JSON string. null, or a value of another
// type (a gateway's reasoning_content {"text":...}, a reasoning array), leaves it unset: a member
// the assembler ignored before it assembled it must not fail the chunk, and so the job. null sets
// null: the member was sent, without text.
type deltaText struct {
	s         string
	set, null bool
}

func (t *deltaText) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		t.null = true
		return nil
	}
	if len(b) == 0 || b[0] != '"' {
		return nil
	}
	t.set = true
	return json.Unmarshal(b, &t.s)
}

// deltaList is a delta member read as a list when it is a JSON array; as deltaText, a value of
// another type leaves it unset.
type deltaList []json.RawMessage

func (l *deltaList) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '[' {
		return nil
	}
	return json.Unmarshal(b, (*[]json.RawMessage)(l))
}

// deltaObject is a member read as an object when it is a JSON object; as deltaText, a value of
// another type leaves it unset (nil).
type deltaObject map[string]json.RawMessage

func (o *deltaObject) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '{' {
		return nil
	}
	return json.Unmarshal(b, (*map[string]json.RawMessage)(o))
}

// deltaCustom is a custom tool call's piece (its name and input pieces) when it is a JSON object;
// as deltaText, a value of another type, or a member of it that is not a string, is left unset.
type deltaCustom struct {
	name, input string
	set         bool
}

func (c *deltaCustom) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '{' {
		return nil
	}
	var v struct {
		Name  deltaText `json:"name"`
		Input deltaText `json:"input"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	c.name, c.input, c.set = v.Name.s, v.Input.s, true
	return nil
}

type openAIChunk struct {
	Error   json.RawMessage     `json:"error"`
	Choices []openAIChunkChoice `json:"choices"`
	Usage   json.RawMessage     `json:"usage"`
}

// event never signals a choice's end: a finish_reason does not promise that the choice's text is
// complete (OpenAI-compatible servers send one on chunks that are not the last: Ollama "" on
// every chunk, proxies "stop" mid-choice), and a tail handed on there and completed into the key
// by the next chunk would reach clients unmasked. What a choice holds goes at data: [DONE].
func (a *openAIAssembler) event(_ string, data []byte, emit func(Delta), _ func(int)) (bool, error) {
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		return true, nil
	}
	if a.top != nil {
		if index, text, ok := contentChunkOf(data, a.keepLate); ok {
			a.content(index, text, emit)
			return false, nil
		}
	}
	var ch openAIChunk
	if err := json.Unmarshal(data, &ch); err != nil {
		return false, fmt.Errorf("%w: stream chunk is not JSON", ErrDecode)
	}
	if len(ch.Error) > 0 && string(ch.Error) != "null" {
		typ, code, msg, _ := parseErrorBody(append(append([]byte(`{"error":`), ch.Error...), '}'))
		return false, &midStreamError{typ: typ, code: code, msg: msg}
	}
	first := a.top == nil || a.topPending
	if first {
		if err := a.setTop(data, len(ch.Choices) > 0); err != nil {
			return false, err
		}
	}
	if len(ch.Usage) > 0 && string(ch.Usage) != "null" {
		a.usage = ch.Usage
		a.n += int64(len(ch.Usage))
	}
	for _, c := range ch.Choices {
		a.choice(c.Index, c, emit)
	}
	a.readRaw(data, &ch, !first)
	return false, nil
}

// setTop takes the top-level fields of a chunk into top: all of them from the first chunk; from a
// later one, while top has no id and no chunk with choices came (topPending), those top lacks or
// has empty ("", 0, null). hasChoices: the chunk carries choices.
func (a *openAIAssembler) setTop(data []byte, hasChoices bool) error {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		return fmt.Errorf("%w: stream chunk is not a JSON object", ErrDecode)
	}
	// Not fields of the message a non-streaming call returns; obfuscation is the stream's padding
	// against size side channels (include_obfuscation, on by default).
	delete(top, "choices")
	delete(top, "usage")
	delete(top, "obfuscation")
	a.n += int64(len(data)) + memberBytes*int64(len(top))
	if a.top == nil {
		a.top = top
	} else {
		for k, v := range top {
			if cur, ok := a.top[k]; !ok || emptyJSON(cur) {
				a.top[k] = v
			}
		}
	}
	a.topPending = emptyJSON(a.top["id"]) && !hasChoices
	return nil
}

// emptyJSON reports whether v is absent, null, "" or 0.
func emptyJSON(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case "", "null", `""`, "0":
		return true
	}
	return false
}

// contentChunkOf reads a chunk whose only choice carries a piece of text and nothing else, as
// the API writes one, {…,"choices":[{"index":N,"delta":{"content":"..."},"logprobs":null,
// "finish_reason":null}],…}, without decoding the chunk: a stream is mostly these. The chunk's
// other top-level members, which vary (id, model, system_fingerprint, service_tier, obfuscation),
// are handed to keep when it is not nil (its key without escapes, which is its decoded form;
// also those of a chunk it then refuses, which event decodes and hands them on again: keep must
// keep a value once, as openAIAssembler's keepLate does); "usage" and "error" must be null or
// absent. ok is false for any other chunk or form (another member of the choice, spaces, a key
// that decoding would match another way), which event decodes in full; when ok, index and text
// are what that decoding gives.
func contentChunkOf(data []byte, keep func(key, value []byte)) (index int, text string, ok bool) {
	if !jsonscan.Valid(data) {
		return 0, "", false
	}
	var choices []byte
	ok = topLevelMembers(data, func(key, value []byte) bool {
		switch k := string(key); {
		case k == "choices":
			if choices != nil {
				return false // a second one: decoding keeps the last
			}
			choices = value
			return true
		case k == "usage" || k == "error":
			return string(value) == "null"
		case bytes.IndexByte(key, '\\') >= 0, strings.EqualFold(k, "choices"), strings.EqualFold(k, "usage"), strings.EqualFold(k, "error"):
			return false // decoding matches keys unescaped and case-insensitively
		}
		if keep != nil {
			keep(key, value)
		}
		return true
	})
	if !ok || choices == nil {
		return 0, "", false
	}
	return indexedText(choices, `[{"index":`, `,"delta":{"content":`, `},"logprobs":null,"finish_reason":null}]`)
}

// topLevelMembers calls f with each member of the JSON object data (valid JSON, checked by the
// caller) in order: its key between the quotes, undecoded, and its value's bytes. It stops, false,
// when f does, or when data is not an object.
func topLevelMembers(data []byte, f func(key, value []byte) bool) bool {
	p := bytes.TrimSpace(data)
	if len(p) < 2 || p[0] != '{' {
		return false
	}
	p = p[1:]
	for {
		p = bytes.TrimLeft(p, " \t\r\n")
		if len(p) > 0 && p[0] == '}' {
			return true
		}
		if len(p) > 0 && p[0] == ',' {
			p = bytes.TrimLeft(p[1:], " \t\r\n")
		}
		end := jsonscan.ValueEnd(p, 0)
		if end < 2 {
			return false
		}
		key := p[1 : end-1]
		p = bytes.TrimLeft(p[end:], " \t\r\n")
		if len(p) == 0 || p[0] != ':' {
			return false
		}
		p = bytes.TrimLeft(p[1:], " \t\r\n")
		end = jsonscan.ValueEnd(p, 0)
		if end == 0 || !f(key, p[:end]) {
			return false
		}
		p = p[end:]
	}
}

func (a *openAIAssembler) kept() int64 { return a.n }

// What kept counts besides the bytes of what an assembler keeps: above what the structures
// holding them take, so that a stream of many small pieces cannot hold more than it counts.
const (
	// entryBytes is for a choice, a tool call or a content block.
	entryBytes = 512
	// memberBytes is for a member of a decoded JSON object kept in a map (its slot, with the map's
	// room to grow, and its key's and value's allocations): a member of a few bytes holds ~100.
	memberBytes = 128
	// elemBytes is for a decoded JSON value kept in a slice (its header, with the slice's room to
	// grow, and its allocation rounded up): a logprobs entry {} holds ~40 bytes.
	elemBytes = 64
)

// writeText appends s to b and returns how much b's spare capacity grew (less than 0 when s used
// some): with len(s), which the callers count, what b holds beyond what it held, its capacity,
// which a builder grows by doubling (a text of 5 MB in 1 KB pieces holds ~5.4 MB).
func writeText(b *strings.Builder, s string) int64 {
	spare := b.Cap() - b.Len()
	b.WriteString(s)
	return int64(b.Cap() - b.Len() - spare)
}

// content is choice for a chunk that contentChunkOf read.
func (a *openAIAssembler) content(i int, text string, emit func(Delta)) {
	ch := a.choices[i]
	if ch == nil {
		ch = &openAIChoice{tools: map[int]*openAITool{}}
		a.choices[i] = ch
		a.n += entryBytes
	}
	a.n += int64(len(text))
	ch.hasContent = true
	if text != "" {
		a.n += writeText(&ch.content, text)
		emit(Delta{Type: DeltaText, Index: i, Text: text})
	}
}

func (a *openAIAssembler) choice(i int, c openAIChunkChoice, emit func(Delta)) {
	ch := a.choices[i]
	if ch == nil {
		ch = &openAIChoice{tools: map[int]*openAITool{}}
		a.choices[i] = ch
		a.n += entryBytes
	}
	d := c.Delta
	a.n += int64(len(d.Role) + len(c.FinishReason) + len(c.NativeFinishReason))
	if d.Content != nil {
		a.n += int64(len(*d.Content))
	}
	if d.Refusal != nil {
		a.n += int64(len(*d.Refusal))
	}
	a.n += int64(len(d.ReasoningContent.s) + len(d.Reasoning.s))
	for _, e := range d.Annotations {
		a.n += int64(len(e)) + elemBytes
	}
	if fc := d.FunctionCall; fc != nil {
		a.n += int64(len(fc.Name) + len(fc.Arguments))
	}
	if lp := c.Logprobs; lp != nil {
		for _, e := range lp.Content {
			a.n += int64(len(e)) + elemBytes
		}
		for _, e := range lp.Refusal {
			a.n += int64(len(e)) + elemBytes
		}
	}
	for _, tc := range d.ToolCalls {
		a.n += int64(len(tc.ID) + len(tc.Type) + len(tc.Function.Name) + len(tc.Function.Arguments))
		a.n += int64(len(tc.Custom.name) + len(tc.Custom.input))
	}
	if d.Role != "" {
		ch.role = d.Role
	}
	if lp := c.Logprobs; lp != nil {
		ch.hasLogprobs = true
		ch.logContent = append(ch.logContent, lp.Content...)
		ch.logRefusal = append(ch.logRefusal, lp.Refusal...)
	}
	if d.Content != nil {
		ch.hasContent = true
		if *d.Content != "" {
			a.n += writeText(&ch.content, *d.Content)
			emit(Delta{Type: DeltaText, Index: i, Text: *d.Content})
		}
	}
	if d.Refusal != nil {
		ch.hasRefusal = true
		if *d.Refusal != "" {
			a.n += writeText(&ch.refusal, *d.Refusal)
			emit(Delta{Type: DeltaRefusal, Index: i, Text: *d.Refusal})
		}
	}
	ch.sentReasoningContent = ch.sentReasoningContent || d.ReasoningContent.null
	ch.sentReasoning = ch.sentReasoning || d.Reasoning.null
	if r := d.ReasoningContent; r.set {
		ch.hasReasoningContent = true
		a.n += writeText(&ch.reasoningContent, r.s)
		ch.think(i, fromReasoningContent, r.s, emit)
	}
	if r := d.Reasoning; r.set {
		ch.hasReasoning = true
		a.n += writeText(&ch.reasoning, r.s)
		ch.think(i, fromReasoning, r.s, emit)
	}
	for _, e := range d.ReasoningDetails {
		a.n += ch.addDetail(i, e, emit)
	}
	ch.annotations = append(ch.annotations, d.Annotations...)
	if fc := d.FunctionCall; fc != nil {
		if ch.function == nil {
			ch.function = &openAITool{}
		}
		name := ch.function.addName(fc.Name)
		a.n += writeText(&ch.function.args, fc.Arguments)
		if name != "" || fc.Arguments != "" {
			emit(Delta{Type: DeltaInputJSON, Index: i, ToolName: name, Text: fc.Arguments})
		}
	}
	for _, tc := range d.ToolCalls {
		moved := len(ch.movedTools)
		k := ch.toolIndex(tc.Index, tc.ID, tc.Function.Name != "" || tc.Custom.name != "",
			tc.Function.Arguments != "" || tc.Custom.input != "")
		if len(ch.movedTools) > moved { // an index moved to a call: pieces at ever new indexes hold
			a.n += entryBytes
		}
		t := ch.tools[k]
		if t == nil {
			t = &openAITool{index: -1, pos: -1}
			if tc.Index != nil {
				t.index = *tc.Index
			}
			ch.tools[k] = t
			ch.nextTool = max(ch.nextTool, k+1)
			a.n += entryBytes
		}
		id := tc.ID // handed on when new: servers that repeat it on every piece
		if id == t.id {
			id = ""
		} else if id != "" {
			t.id = id
		}
		if tc.Type != "" {
			t.typ = tc.Type
		}
		name, args := tc.Function.Name, tc.Function.Arguments
		if cu := tc.Custom; cu.set {
			t.custom = true
			name, args = name+cu.name, args+cu.input
		}
		name = t.addName(name)
		a.n += writeText(&t.args, args)
		if id != "" || name != "" || args != "" {
			if t.pos < 0 {
				if ch.places == nil {
					ch.places = &toolPlaces{}
				}
				t.pos = len(ch.places.keyAt)
				ch.places.keyAt = append(ch.places.keyAt, k)
			}
			ch.places.setBare(t)
			emit(Delta{Type: DeltaInputJSON, Index: i, ToolIndex: t.pos, ToolID: id, ToolName: name,
				Text: args})
		}
	}
	if c.ContentFilterResults != nil {
		a.n += ch.addFilters(c.ContentFilterResults)
	}
	if len(c.FinishReason) > 0 && string(c.FinishReason) != "null" {
		ch.finishReason = c.FinishReason
	}
	if c.NativeFinishReason != nil {
		ch.hasNative = true
		if string(c.NativeFinishReason) != "null" {
			ch.nativeFinish = c.NativeFinishReason
		}
	}
}

// toolIndex returns the key in tools of the call a piece goes to (named: the piece carries a piece
// of the call's name; args: a piece of its arguments); not the call's place in the message
// (openAITool.pos). A piece with an index (OpenAI and most servers) goes to the call of that index,
// unless it brings only arguments at an index no call was opened at, past the last call's, while a
// named call still has none (awaitingArgs: a proxy sent parallel calls' headers at index 0 and
// their arguments at 1, 2...), or it opens another call there: it has an id and a name, and that
// call another id (Ollama gives each of parallel calls index 0, whole with its own id); or that
// call was opened by another index's pieces and the piece is named. Then it goes to the next free
// key, a new call, which the later pieces of its index go to. A piece with arguments and no name
// that would open a call at an index no call has, or go to a call the last piece did not go to
// under an id that call lacks, continues the call the last piece went to, if that call has a name
// and the piece no id or the call no arguments yet (continuesLast), and so do the later pieces of
// its index (SGLang sent a call's name at its tool's index in the request, its arguments at the
// call's own index, each piece with a new id). A piece with a new id and no name continues the call
// (Poolside, and LiteLLM over OCI, send a call's later pieces under another id than its first).
// Without an index (Gemini sends each of parallel calls whole, with its id and no index), the call
// the last piece went to, unless the piece has an id that call lacks (another id, or none after a
// piece that brought something): then the next free key, a new call. Servers send a call's id on
// its first piece, and not later but as a repeat, so an id the call did not open with is the next
// call's.
func (c *openAIChoice) toolIndex(index *int, id string, named, args bool) int {
	switch {
	case index != nil:
		k, moved := c.movedTools[*index]
		if !moved {
			k = *index
		}
		t := c.tools[k]
		switch {
		case args && !named && id == "" && !moved && (t == nil || t.index >= 0 && t.index != *index) &&
			c.awaitingArgs(*index, &k):
			c.moveIndex(*index, k)
		case t != nil && (t.index >= 0 && t.index != *index && (named || !moved) ||
			named && id != "" && t.id != "" && t.id != id):
			k = c.nextTool
			c.moveIndex(*index, k)
		case args && !named && k != c.lastTool && (t == nil || id != "" && id != t.id) && c.continuesLast(id):
			k = c.lastTool
			c.moveIndex(*index, k)
		}
		c.lastTool = k
	case id != "":
		if t := c.tools[c.lastTool]; t != nil && t.id != id && !t.empty() {
			c.lastTool = c.nextTool
		}
	}
	return c.lastTool
}

// moveIndex sends the later pieces of the server's index to the call of key k.
func (c *openAIChoice) moveIndex(index, k int) {
	if c.movedTools == nil {
		c.movedTools = map[int]int{}
	}
	c.movedTools[index] = k
}

// continuesLast reports whether a nameless piece with arguments under id, at another index than
// the last piece's, continues the call the last piece went to: that call has a name, and no
// arguments yet (SGLang's name piece, which the call's arguments follow at another index under a
// new id), or the piece has no id (Nebius sent a call's last piece of arguments at the next
// index). A piece with an id after a call with arguments opens another call, whose name comes
// later (servers that open a call with its id and arguments), or whose pieces interleave with it.
func (c *openAIChoice) continuesLast(id string) bool {
	t := c.tools[c.lastTool]
	return t != nil && t.name != "" && (id == "" || t.args.Len() == 0)
}

// awaitingArgs reports whether a piece of only arguments (no id, no name) at index, where no
// call was opened, goes to a named call still without arguments (bare), and sets *k to that
// call's key: the first placed after the call the last piece went to, or, if that call is one of
// them, the first placed of all. A server that sends each of parallel calls' header (id and name)
// at one index and their arguments at the indexes after it, in the order the calls were opened (a
// Responses-to-Chat translator that advanced its index only as a call closed), has its arguments
// each join their header. An index not past the one that opened the last call is not such a
// server's: the piece goes by the rules for another index (continuesLast: LibreChat's agents API
// sent a call's arguments at a lower index than its id, and a parameterless call before it has
// none), and so does a piece after a call that has arguments with no such call after it
// (Nebius's last piece at the next index).
func (c *openAIChoice) awaitingArgs(index int, k *int) bool {
	last := c.tools[c.lastTool]
	if last == nil || last.name == "" || index <= last.index {
		return false
	}
	from := 0
	if last.args.Len() > 0 { // only calls placed after the last one's
		from = last.pos + 1
	}
	p := c.places // last has a name: it has a place
	for w := from / 64; w < len(p.bare); w++ {
		word := p.bare[w]
		if w == from/64 {
			word &^= 1<<(from%64) - 1
		}
		if word != 0 {
			*k = p.keyAt[w*64+bits.TrailingZeros64(word)]
			return true
		}
	}
	return false
}

// setBare records whether t, which has a place, is bare: it has a name and no arguments yet.
func (p *toolPlaces) setBare(t *openAITool) {
	w, bit := t.pos/64, uint64(1)<<(t.pos%64)
	for len(p.bare) <= w {
		p.bare = append(p.bare, 0)
	}
	if t.name != "" && t.args.Len() == 0 {
		p.bare[w] |= bit
	} else {
		p.bare[w] &^= bit
	}
}

// empty reports whether no piece brought the call anything: no id, name nor arguments.
func (t *openAITool) empty() bool { return t.id == "" && t.name == "" && t.args.Len() == 0 }

// addDetail takes an entry of a chunk's reasoning_details into the choice's, merged into the
// entry of its index (an entry without one is its own), hands its text on as thinking
// (reasoning.text's text, reasoning.summary's summary; not encrypted data) and returns the bytes
// the choice now keeps beyond what it kept. An element that is not an object is left out.
func (c *openAIChoice) addDetail(i int, e json.RawMessage, emit func(Delta)) int64 {
	var m map[string]json.RawMessage
	if json.Unmarshal(e, &m) != nil || m == nil {
		return 0
	}
	var n int64
	var d *reasoningDetail
	var index int
	raw, hasIndex := m["index"]
	hasIndex = hasIndex && string(raw) != "null" && json.Unmarshal(raw, &index) == nil
	if at, ok := c.detailAt[index]; ok && hasIndex {
		d = c.details[at]
	} else {
		d = &reasoningDetail{members: map[string]json.RawMessage{}, texts: map[string]*strings.Builder{}}
		if hasIndex {
			if c.detailAt == nil {
				c.detailAt = map[int]int{}
			}
			c.detailAt[index] = len(c.details)
		}
		c.details = append(c.details, d)
		n += entryBytes
	}
	// In key order: the thinking deltas of an entry with both text and summary are always the same.
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		var piece deltaText
		if isDetailText(k) {
			_ = piece.UnmarshalJSON(v) // a value that is not a string is kept as another member
		}
		b, ok := d.texts[k]
		switch {
		case piece.set && !ok:
			b = &strings.Builder{}
			d.texts[k] = b
			n += int64(len(k)) + memberBytes
			fallthrough
		case piece.set:
			n += writeText(b, piece.s)
			n += int64(len(piece.s))
			if k != "data" {
				c.think(i, fromReasoningDetails, piece.s, emit)
			}
		case ok:
			// a text member already joined: a null or other value later does not replace it
		default:
			n += keepMember(d.members, k, v)
		}
	}
	return n
}

// keepMember sets m[k] to v, unless v is null and m has k (a member kept at its last non-null
// value, null when only null came), and returns the bytes m now keeps beyond what it kept.
func keepMember(m map[string]json.RawMessage, k string, v json.RawMessage) int64 {
	cur, had := m[k]
	switch {
	case !had:
		m[k] = v
		return int64(len(k)+len(v)) + memberBytes
	case string(v) != "null":
		m[k] = v
		return int64(len(v) - len(cur))
	}
	return 0
}

// think hands on a piece of the choice's reasoning, from the member from, as DeltaThinking when
// that member is the one the choice's thinking deltas come from (the first to bring text).
func (c *openAIChoice) think(i int, from reasoningField, text string, emit func(Delta)) {
	if text == "" {
		return
	}
	if c.thinkFrom == 0 {
		c.thinkFrom = from
	}
	if c.thinkFrom == from {
		emit(Delta{Type: DeltaThinking, Index: i, Text: text})
	}
}

// addName adds a piece of the tool's name and returns what it added: "" for a repeat. Compatible
// servers send the whole name on every chunk of a call, or on a chunk of its own without id nor
// arguments (OpenAI on the first only), others cut it into pieces without the id (Gemini:
// "edit_ex", "isting_file"): a piece equal to the whole name so far is a repeat, whatever else the
// chunk carries. So a name cut into two equal halves ("echo_", "echo_") is kept as one half: the
// stream cannot tell it from a repeat, and repeats are what servers send.
func (t *openAITool) addName(piece string) string {
	if piece == "" || piece == t.name {
		return ""
	}
	t.name += piece
	return piece
}

// addFilters takes a chunk's content_filter_results into the choice's and returns the bytes
// it now keeps beyond what it kept: a category is kept at its most severe report, the later one
// when as severe (filterRank).
func (c *openAIChoice) addFilters(results map[string]json.RawMessage) int64 {
	c.hasFilters = true
	var n int64
	for k, v := range results {
		cur, ok := c.filters[k]
		switch {
		case !ok:
			if c.filters == nil {
				c.filters = map[string]json.RawMessage{}
			}
			c.filters[k] = v
			n += int64(len(k)+len(v)) + memberBytes
		case !bytes.Equal(cur, v) && filterRank(v) >= filterRank(cur):
			c.filters[k] = v
			n += int64(len(v) - len(cur))
		}
	}
	return n
}

// filterRank orders the reports of an Azure content filter category by severity: filtered above
// detected (protected material, jailbreak) above the severity (high, medium, low, safe); a
// report without those (an error, a blocklist's details) ranks lowest.
func filterRank(report json.RawMessage) int {
	var r struct {
		Filtered bool   `json:"filtered"`
		Detected bool   `json:"detected"`
		Severity string `json:"severity"`
	}
	if json.Unmarshal(report, &r) != nil {
		return 0
	}
	rank := slices.Index([]string{"safe", "low", "medium", "high"}, r.Severity) + 1 // 0 when none
	if r.Detected {
		rank += 10
	}
	if r.Filtered {
		rank += 20
	}
	return rank
}

func (a *openAIAssembler) usageSoFar() json.RawMessage { return a.usage }

func (a *openAIAssembler) message() ([]byte, json.RawMessage, error) {
	if a.top == nil {
		return nil, nil, fmt.Errorf("%w: stream ended without a chunk", ErrDecode)
	}
	out := map[string]json.RawMessage{}
	for k, v := range a.top {
		out[k] = v
	}
	for k, v := range a.late { // members top lacks or has null
		out[k] = v
	}
	out["object"] = mustMarshal("chat.completion")
	idx := make([]int, 0, len(a.choices))
	for i := range a.choices {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	choices := make([]json.RawMessage, 0, len(idx))
	for _, i := range idx {
		choices = append(choices, a.choices[i].render(i))
	}
	out["choices"] = mustMarshal(choices)
	usage := a.usage
	if usage == nil {
		usage = json.RawMessage("null")
	}
	out["usage"] = usage
	return mustMarshal(out), a.usage, nil
}

// render writes the choice as a non-streaming answer carries it.
func (c *openAIChoice) render(i int) json.RawMessage {
	msg := map[string]any{"role": c.role, "content": nil, "refusal": nil}
	if c.role == "" {
		msg["role"] = "assistant"
	}
	if c.hasContent {
		msg["content"] = c.content.String()
	}
	if c.hasRefusal {
		msg["refusal"] = c.refusal.String()
	}
	// Every non-streaming message has annotations (url_citation with web search), [] when none.
	msg["annotations"] = c.annotations
	if c.annotations == nil {
		msg["annotations"] = []json.RawMessage{}
	}
	switch {
	case c.hasReasoningContent:
		msg["reasoning_content"] = c.reasoningContent.String()
	case c.sentReasoningContent:
		msg["reasoning_content"] = nil
	}
	switch {
	case c.hasReasoning:
		msg["reasoning"] = c.reasoning.String()
	case c.sentReasoning:
		msg["reasoning"] = nil
	}
	if len(c.details) > 0 {
		details := make([]map[string]any, 0, len(c.details))
		for _, d := range c.details {
			entry := make(map[string]any, len(d.members)+len(d.texts))
			for k, v := range d.members {
				entry[k] = v
			}
			for k, b := range d.texts {
				entry[k] = b.String()
			}
			details = append(details, entry)
		}
		msg["reasoning_details"] = details
	}
	if c.places != nil { // a call that no piece brought anything has no place: no call, no empty list
		calls := make([]map[string]any, len(c.places.keyAt))
		for _, t := range c.tools {
			if t.pos < 0 {
				continue
			}
			if t.typ == "custom" || t.typ == "" && t.custom {
				calls[t.pos] = map[string]any{"id": t.id, "type": "custom",
					"custom": map[string]string{"name": t.name, "input": t.args.String()}}
				continue
			}
			calls[t.pos] = map[string]any{"id": t.id, "type": t.typ,
				"function": map[string]string{"name": t.name, "arguments": t.args.String()}}
		}
		msg["tool_calls"] = calls
	} else if c.sentNullTools {
		msg["tool_calls"] = nil
	}
	if f := c.function; f != nil {
		msg["function_call"] = map[string]string{"name": f.name, "arguments": f.args.String()}
	}
	finish := c.finishReason
	if finish == nil {
		finish = json.RawMessage("null")
	}
	var logprobs any // null, as a non-streaming answer without "logprobs": true has it
	if c.hasLogprobs {
		logprobs = map[string]any{"content": c.logContent, "refusal": c.logRefusal}
	}
	choice := make(map[string]any, len(c.extras)+6)
	for k, v := range c.extras { // first: a member the choice renders is never an extra's
		choice[k] = v
	}
	choice["index"] = i
	choice["message"] = msg
	choice["logprobs"] = logprobs
	choice["finish_reason"] = finish
	if c.hasNative {
		native := c.nativeFinish
		if native == nil {
			native = json.RawMessage("null")
		}
		choice["native_finish_reason"] = native
	}
	if c.hasFilters {
		filters := c.filters
		if filters == nil {
			filters = map[string]json.RawMessage{}
		}
		choice["content_filter_results"] = filters
	}
	return mustMarshal(choice)
}
