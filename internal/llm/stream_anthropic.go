package llm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"
)

// anthropicAssembler reads the Messages API stream: message_start carries the message without
// content; content_block_start/delta/stop build each block (text_delta, input_json_delta,
// thinking_delta, signature_delta; a tool call's input comes whole in content_block_start from
// some compatible servers); message_delta carries the message's top-level changes
// (stop_reason, stop_sequence, container...), context_management and the usage so far;
// message_stop ends it; ping is ignored; an error event fails the stream.
type anthropicAssembler struct {
	msg    map[string]json.RawMessage
	usage  map[string]json.RawMessage
	blocks []*anthropicBlock
	n      int64 // kept
	// outputReported: a message_delta's usage gave output_tokens (not null). message_start's is
	// a placeholder (1) written before any output: a stream whose output was never reported after
	// it, ended or failed, is settled as one whose usage has no output count
	// (Usage.OutputUnreported).
	outputReported bool
}

type anthropicBlock struct {
	raw       map[string]json.RawMessage // content_block of content_block_start
	typ       string
	text      strings.Builder // text, thinking
	json      strings.Builder // tool input
	signature strings.Builder
	citations []json.RawMessage // citations_delta's, in order (text blocks)
	// stopped: its content_block_stop came, and the masker handed on what it held of the block,
	// so a later delta could complete a key it began: one is refused.
	stopped bool
}

func (anthropic) assembler() assembler { return &anthropicAssembler{} }

type anthropicEvent struct {
	Type         string                     `json:"type"`
	Index        int                        `json:"index"`
	Message      map[string]json.RawMessage `json:"message"`
	ContentBlock map[string]json.RawMessage `json:"content_block"`
	Delta        struct {
		Type        string          `json:"type"`
		Text        string          `json:"text"`
		PartialJSON string          `json:"partial_json"`
		Thinking    string          `json:"thinking"`
		Signature   string          `json:"signature"`
		Citation    json.RawMessage `json:"citation"`
	} `json:"delta"`
	Usage map[string]json.RawMessage `json:"usage"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (a *anthropicAssembler) event(name string, data []byte, emit func(Delta), end func(int)) (bool, error) {
	if index, text, ok := textDeltaOf(data); ok {
		if err := a.open(index); err != nil {
			return false, err
		}
		a.n += int64(len(text)) + writeText(&a.blocks[index].text, text)
		emit(Delta{Type: DeltaText, Index: index, Text: text})
		return false, nil
	}
	var ev anthropicEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return false, fmt.Errorf("%w: stream event %q is not JSON", ErrDecode, name)
	}
	if ev.Type == "" {
		ev.Type = name
	}
	switch ev.Type {
	case "message_start", "message_delta": // kept, in part (message_delta's members below)
		a.n += int64(len(data)) + memberBytes*int64(len(ev.Message))
	case "content_block_start":
		a.n += int64(len(data)) + entryBytes + memberBytes*int64(len(ev.ContentBlock))
	case "content_block_delta":
		d := ev.Delta
		a.n += int64(len(d.Text) + len(d.PartialJSON) + len(d.Thinking) + len(d.Signature) + len(d.Citation))
		if d.Type == "citations_delta" {
			a.n += elemBytes
		}
	}
	switch ev.Type {
	case "message_start":
		a.msg = ev.Message
		if a.msg == nil {
			return false, fmt.Errorf("%w: message_start without a message", ErrDecode)
		}
		a.mergeUsage(a.msg["usage"])
	case "content_block_start":
		// A block started again would take the place of one whose deltas (and held tail) went
		// out: the body would lose them, and its text could complete a key the tail began.
		if ev.Index != len(a.blocks) {
			return false, fmt.Errorf("%w: content block %d out of order", ErrDecode, ev.Index)
		}
		b := &anthropicBlock{raw: ev.ContentBlock}
		_ = json.Unmarshal(b.raw["type"], &b.typ)
		a.blocks = append(a.blocks, b)
		if tracksToolInput(b.typ) {
			var id, name string
			_ = json.Unmarshal(b.raw["id"], &id)
			_ = json.Unmarshal(b.raw["name"], &name)
			emit(Delta{Type: DeltaInputJSON, Index: ev.Index, ToolID: id, ToolName: name})
		}
	case "content_block_delta":
		if err := a.open(ev.Index); err != nil {
			return false, err
		}
		a.delta(a.blocks[ev.Index], ev, emit)
	case "content_block_stop":
		if ev.Index >= 0 && ev.Index < len(a.blocks) && !a.blocks[ev.Index].stopped {
			a.blocks[ev.Index].startInput(ev.Index, emit)
			a.blocks[ev.Index].stopped = true
			end(ev.Index) // its last characters go before the next block's
		}
	case "message_delta":
		if a.msg == nil {
			return false, fmt.Errorf("%w: message_delta before message_start", ErrDecode)
		}
		// Its delta is the message's top-level changes, all of them (stop_reason, stop_sequence,
		// the code execution tool's container...), context_management a field beside it.
		var md struct {
			Delta             map[string]json.RawMessage `json:"delta"`
			ContextManagement json.RawMessage            `json:"context_management"`
		}
		if err := json.Unmarshal(data, &md); err != nil {
			return false, fmt.Errorf("%w: message_delta is not JSON", ErrDecode)
		}
		for k, v := range md.Delta {
			a.msg[k] = v
		}
		a.n += memberBytes * int64(len(md.Delta))
		if len(md.ContextManagement) > 0 {
			a.msg["context_management"] = md.ContextManagement
		}
		for k, v := range ev.Usage {
			a.setUsage(k, v)
			if k == "output_tokens" && string(bytes.TrimSpace(v)) != "null" {
				a.outputReported = true
			}
		}
	case "message_stop":
		for i, b := range a.blocks {
			if !b.stopped {
				b.startInput(i, emit)
			}
		}
		return true, nil
	case "error":
		return false, &midStreamError{typ: ev.Error.Type, msg: ev.Error.Message}
	}
	return false, nil // ping, and event types added later
}

func (a *anthropicAssembler) kept() int64 { return a.n }

// tracksToolInput reports whether a block of type typ has an input that input_json_delta builds,
// as the SDKs' stream accumulators read it.
func tracksToolInput(typ string) bool {
	return typ == "tool_use" || typ == "server_tool_use" || typ == "mcp_tool_use"
}

// open refuses a delta for a block that was never started or has stopped.
func (a *anthropicAssembler) open(index int) error {
	switch {
	case index < 0 || index >= len(a.blocks):
		return fmt.Errorf("%w: delta for unknown content block %d", ErrDecode, index)
	case a.blocks[index].stopped:
		return fmt.Errorf("%w: delta for content block %d after its content_block_stop", ErrDecode, index)
	}
	return nil
}

// textDeltaOf reads a text delta written as the Messages API writes one,
// {"type":"content_block_delta","index":N,"delta":{"type":"text_delta","text":"..."}}, without
// decoding the event into anthropicEvent: a stream is mostly these, and their decoding was most of
// a worker's own work per token. ok is false for any other event or form (other fields, another
// order, spaces), which event decodes in full; when ok, index and text are what that decoding
// gives.
func textDeltaOf(data []byte) (index int, text string, ok bool) {
	return indexedText(data, `{"type":"content_block_delta","index":`, `,"delta":{"type":"text_delta","text":`, `}}`)
}

// indexedText reads data written exactly as prefix, a JSON index (no sign, no leading zero, at
// most 9 digits), middle, one JSON string and suffix: the index and the string as decoding gives
// them. ok is false for anything else.
func indexedText(data []byte, prefix, middle, suffix string) (index int, text string, ok bool) {
	rest, found := cutPrefix(data, prefix)
	if !found {
		return 0, "", false
	}
	digits := 0
	for ; digits < len(rest) && digits < 9 && rest[digits] >= '0' && rest[digits] <= '9'; digits++ {
		index = index*10 + int(rest[digits]-'0')
	}
	if digits == 0 || (digits > 1 && rest[0] == '0') { // JSON has no leading zeros
		return 0, "", false
	}
	rest, found = cutPrefix(rest[digits:], middle)
	if !found {
		return 0, "", false
	}
	lit, found := cutSuffix(rest, suffix)
	if !found || len(lit) < 2 || lit[0] != '"' || lit[len(lit)-1] != '"' {
		return 0, "", false
	}
	if inner := lit[1 : len(lit)-1]; plainJSONString(inner) {
		return index, string(inner), true
	}
	if json.Unmarshal(lit, &text) != nil { // escapes, or not one string
		return 0, "", false
	}
	return index, text, true
}

// cutPrefix is bytes.CutPrefix for a string prefix, without converting it.
func cutPrefix(b []byte, prefix string) ([]byte, bool) {
	if len(b) < len(prefix) || string(b[:len(prefix)]) != prefix {
		return b, false
	}
	return b[len(prefix):], true
}

// cutSuffix is bytes.CutSuffix for a string suffix, without converting it.
func cutSuffix(b []byte, suffix string) ([]byte, bool) {
	if len(b) < len(suffix) || string(b[len(b)-len(suffix):]) != suffix {
		return b, false
	}
	return b[:len(b)-len(suffix)], true
}

// plainJSONString reports whether s, between a JSON string's quotes, is its text as it is: no
// quote, backslash or control character, and valid UTF-8 (which decoding would replace).
func plainJSONString(s []byte) bool {
	for _, c := range s {
		if c < 0x20 || c == '"' || c == '\\' {
			return false
		}
	}
	return utf8.Valid(s)
}

func (a *anthropicAssembler) delta(b *anthropicBlock, ev anthropicEvent, emit func(Delta)) {
	switch ev.Delta.Type {
	case "text_delta":
		a.n += writeText(&b.text, ev.Delta.Text)
		emit(Delta{Type: DeltaText, Index: ev.Index, Text: ev.Delta.Text})
	case "input_json_delta":
		a.n += writeText(&b.json, ev.Delta.PartialJSON)
		emit(Delta{Type: DeltaInputJSON, Index: ev.Index, Text: ev.Delta.PartialJSON})
	case "thinking_delta":
		a.n += writeText(&b.text, ev.Delta.Thinking)
		emit(Delta{Type: DeltaThinking, Index: ev.Index, Text: ev.Delta.Thinking})
	case "signature_delta":
		a.n += writeText(&b.signature, ev.Delta.Signature)
	case "citations_delta":
		if len(ev.Delta.Citation) > 0 {
			b.citations = append(b.citations, ev.Delta.Citation)
		}
	}
}

func (a *anthropicAssembler) mergeUsage(raw json.RawMessage) {
	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) == nil {
		for k, v := range u {
			a.setUsage(k, v)
		}
	}
}

// setUsage keeps the latest value of a usage field; message_delta's counts are cumulative,
// and a null does not erase a count message_start gave.
func (a *anthropicAssembler) setUsage(k string, v json.RawMessage) {
	if a.usage == nil {
		a.usage = map[string]json.RawMessage{}
	}
	_, had := a.usage[k]
	if had && string(bytes.TrimSpace(v)) == "null" {
		return
	}
	if !had {
		a.n += memberBytes + int64(len(k)+len(v))
	}
	a.usage[k] = v
}

func (a *anthropicAssembler) usageSoFar() json.RawMessage {
	if a.usage == nil {
		return nil
	}
	return a.counted(mustMarshal(a.usage))
}

// counted is the usage the stream reported (whole, a.usage encoded), less message_start's
// placeholder output_tokens when no message_delta gave the output since: a usage without an
// output count (Usage.OutputUnreported), not one of 1 output token.
func (a *anthropicAssembler) counted(whole json.RawMessage) json.RawMessage {
	if _, placeholder := a.usage["output_tokens"]; !placeholder || a.outputReported {
		return whole
	}
	counted := make(map[string]json.RawMessage, len(a.usage))
	for k, v := range a.usage {
		if k != "output_tokens" {
			counted[k] = v
		}
	}
	return mustMarshal(counted)
}

func (a *anthropicAssembler) message() ([]byte, json.RawMessage, error) {
	if a.msg == nil {
		return nil, nil, fmt.Errorf("%w: stream ended without message_start", ErrDecode)
	}
	content := make([]json.RawMessage, 0, len(a.blocks))
	for _, b := range a.blocks {
		content = append(content, b.block())
	}
	a.msg["content"] = mustMarshal(content)
	whole := mustMarshal(a.usage)
	a.msg["usage"] = whole // as the provider sent it, message_start's placeholder included
	return mustMarshal(a.msg), a.counted(whole), nil
}

// startInput hands on, as the input_json delta of the block at index, the input its
// content_block_start brought whole (Anthropic-compatible servers that translate a whole call),
// when no delta brought input: the input the stored block has (block), so that the block's
// input_json deltas add up to it. It is called at the block's end, when no delta can replace it
// any more. Anthropic's own start ("input":{}, the input in deltas) adds nothing.
func (b *anthropicBlock) startInput(index int, emit func(Delta)) {
	if !tracksToolInput(b.typ) || strings.TrimSpace(b.json.String()) != "" {
		return
	}
	var text bytes.Buffer
	if start := b.raw["input"]; len(start) == 0 || json.Compact(&text, start) != nil {
		return
	}
	switch text.String() {
	case "null", "{}":
		return
	}
	emit(Delta{Type: DeltaInputJSON, Index: index, Text: text.String()})
}

// block renders a content block as a non-streaming answer carries it.
func (b *anthropicBlock) block() json.RawMessage {
	out := map[string]json.RawMessage{}
	for k, v := range b.raw {
		out[k] = v
	}
	switch b.typ {
	case "text":
		out["text"] = mustMarshal(b.text.String())
		if len(b.citations) > 0 {
			out["citations"] = mustMarshal(b.citations)
		}
	case "thinking":
		out["thinking"] = mustMarshal(b.text.String())
		out["signature"] = mustMarshal(b.signature.String())
	case "tool_use", "server_tool_use", "mcp_tool_use": // tracksToolInput
		input := json.RawMessage(b.json.String())
		if len(bytes.TrimSpace(input)) == 0 {
			// No delta brought input: the start's (Anthropic-compatible servers that send it
			// whole there, and no input_json_delta), or none (Anthropic's is {}).
			input = json.RawMessage("{}")
			if start := b.raw["input"]; len(start) > 0 && string(start) != "null" {
				input = start
			}
		}
		if !json.Valid(input) {
			// Cut by max_tokens, or streamed without validation (eager_input_streaming): the
			// provider's answer all the same, wrapped as Anthropic documents for passing invalid
			// input back.
			input = mustMarshal(map[string]string{"INVALID_JSON": b.json.String()})
		}
		out["input"] = input
	}
	return mustMarshal(out)
}

// mustMarshal encodes values built from decoded JSON, which always encode.
func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("llm: encode assembled message: " + err.Error())
	}
	return b
}
