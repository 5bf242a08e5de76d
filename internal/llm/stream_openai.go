package llm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/llmq/llmq/internal/jsonscan"
)

// openAIAssembler reads the Chat Completions stream: data-only chat.completion.chunk events whose
// choices carry deltas (role, content, refusal, tool_calls by index with id, name and argument
// pieces, or the legacy function_call) and a finish_reason; a chunk with a non-null usage
// (stream_options.include_usage); data: [DONE] ends it; a chunk {"error":{...}} fails it.
type openAIAssembler struct {
	top     map[string]json.RawMessage // the first chunk's fields, but choices, usage and obfuscation
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
	role          string
	content       strings.Builder
	hasContent    bool
	refusal       strings.Builder
	hasRefusal    bool
	tools         map[int]*openAITool
	function      *openAITool // the legacy function_call (a request with "functions")
	finishReason  json.RawMessage
	hasToolsField bool
	// logprobs (with "logprobs": true): every chunk's content and refusal entries, in order.
	hasLogprobs bool
	logContent  []json.RawMessage
	logRefusal  []json.RawMessage
}

type openAITool struct {
	id, typ, name string
	args          strings.Builder
}

func (openAI) assembler() assembler { return &openAIAssembler{choices: map[int]*openAIChoice{}} }

type openAIChunkChoice struct {
	Index int `json:"index"`
	Delta struct {
		Role         string  `json:"role"`
		Content      *string `json:"content"`
		Refusal      *string `json:"refusal"`
		FunctionCall *struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function_call"`
		ToolCalls []struct {
			Index    int    `json:"index"`
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"delta"`
	Logprobs *struct {
		Content []json.RawMessage `json:"content"`
		Refusal []json.RawMessage `json:"refusal"`
	} `json:"logprobs"`
	FinishReason json.RawMessage `json:"finish_reason"`
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
		if index, text, ok := contentChunkOf(data); ok {
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
	if a.top == nil || a.topPending {
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
// are skipped; "usage" and "error" must be null or absent. ok is false for any other chunk or
// form (another member of the choice, spaces, a key that decoding would match another way), which
// event decodes in full; when ok, index and text are what that decoding gives.
func contentChunkOf(data []byte) (index int, text string, ok bool) {
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
		ch.content.WriteString(text)
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
	a.n += int64(len(d.Role) + len(c.FinishReason))
	if d.Content != nil {
		a.n += int64(len(*d.Content))
	}
	if d.Refusal != nil {
		a.n += int64(len(*d.Refusal))
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
			ch.content.WriteString(*d.Content)
			emit(Delta{Type: DeltaText, Index: i, Text: *d.Content})
		}
	}
	if d.Refusal != nil {
		ch.hasRefusal = true
		if *d.Refusal != "" {
			ch.refusal.WriteString(*d.Refusal)
			emit(Delta{Type: DeltaRefusal, Index: i, Text: *d.Refusal})
		}
	}
	if fc := d.FunctionCall; fc != nil {
		if ch.function == nil {
			ch.function = &openAITool{}
		}
		ch.function.name += fc.Name
		ch.function.args.WriteString(fc.Arguments)
		if fc.Name != "" || fc.Arguments != "" {
			emit(Delta{Type: DeltaInputJSON, Index: i, ToolName: fc.Name, Text: fc.Arguments})
		}
	}
	for _, tc := range d.ToolCalls {
		ch.hasToolsField = true
		t := ch.tools[tc.Index]
		if t == nil {
			t = &openAITool{}
			ch.tools[tc.Index] = t
			a.n += entryBytes
		}
		if tc.ID != "" {
			t.id = tc.ID
		}
		if tc.Type != "" {
			t.typ = tc.Type
		}
		t.name += tc.Function.Name
		t.args.WriteString(tc.Function.Arguments)
		if tc.ID != "" || tc.Function.Name != "" || tc.Function.Arguments != "" {
			emit(Delta{Type: DeltaInputJSON, Index: i, ToolIndex: tc.Index, ToolID: tc.ID, ToolName: tc.Function.Name,
				Text: tc.Function.Arguments})
		}
	}
	if len(c.FinishReason) > 0 && string(c.FinishReason) != "null" {
		ch.finishReason = c.FinishReason
	}
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
	if c.hasToolsField {
		keys := make([]int, 0, len(c.tools))
		for k := range c.tools {
			keys = append(keys, k)
		}
		sort.Ints(keys)
		calls := make([]map[string]any, 0, len(keys))
		for _, k := range keys {
			t := c.tools[k]
			calls = append(calls, map[string]any{"id": t.id, "type": t.typ,
				"function": map[string]string{"name": t.name, "arguments": t.args.String()}})
		}
		msg["tool_calls"] = calls
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
	return mustMarshal(map[string]any{"index": i, "message": msg, "logprobs": logprobs, "finish_reason": finish})
}
