package llm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// anthropicAssembler reads the Messages API stream: message_start carries the message without
// content; content_block_start/delta/stop build each block (text_delta, input_json_delta,
// thinking_delta, signature_delta); message_delta carries stop_reason, stop_sequence and the
// usage so far; message_stop ends it; ping is ignored; an error event fails the stream.
type anthropicAssembler struct {
	msg    map[string]json.RawMessage
	usage  map[string]json.RawMessage
	blocks []*anthropicBlock
}

type anthropicBlock struct {
	raw       map[string]json.RawMessage // content_block of content_block_start
	typ       string
	text      strings.Builder // text, thinking
	json      strings.Builder // tool input
	signature strings.Builder
}

func (anthropic) assembler() assembler { return &anthropicAssembler{} }

type anthropicEvent struct {
	Type         string                     `json:"type"`
	Index        int                        `json:"index"`
	Message      map[string]json.RawMessage `json:"message"`
	ContentBlock map[string]json.RawMessage `json:"content_block"`
	Delta        struct {
		Type         string          `json:"type"`
		Text         string          `json:"text"`
		PartialJSON  string          `json:"partial_json"`
		Thinking     string          `json:"thinking"`
		Signature    string          `json:"signature"`
		StopReason   json.RawMessage `json:"stop_reason"`
		StopSequence json.RawMessage `json:"stop_sequence"`
	} `json:"delta"`
	Usage map[string]json.RawMessage `json:"usage"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func (a *anthropicAssembler) event(name string, data []byte, emit func(Delta)) (bool, error) {
	var ev anthropicEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return false, fmt.Errorf("%w: stream event %q is not JSON", ErrDecode, name)
	}
	if ev.Type == "" {
		ev.Type = name
	}
	switch ev.Type {
	case "message_start":
		a.msg = ev.Message
		if a.msg == nil {
			return false, fmt.Errorf("%w: message_start without a message", ErrDecode)
		}
		a.mergeUsage(a.msg["usage"])
	case "content_block_start":
		if ev.Index < 0 || ev.Index > len(a.blocks) {
			return false, fmt.Errorf("%w: content block %d out of order", ErrDecode, ev.Index)
		}
		b := &anthropicBlock{raw: ev.ContentBlock}
		_ = json.Unmarshal(b.raw["type"], &b.typ)
		a.blocks = append(a.blocks[:ev.Index], b)
		if b.typ == "tool_use" || b.typ == "server_tool_use" {
			var id, name string
			_ = json.Unmarshal(b.raw["id"], &id)
			_ = json.Unmarshal(b.raw["name"], &name)
			emit(Delta{Type: DeltaInputJSON, Index: ev.Index, ToolID: id, ToolName: name})
		}
	case "content_block_delta":
		if ev.Index < 0 || ev.Index >= len(a.blocks) {
			return false, fmt.Errorf("%w: delta for unknown content block %d", ErrDecode, ev.Index)
		}
		a.delta(a.blocks[ev.Index], ev, emit)
	case "message_delta":
		if a.msg == nil {
			return false, fmt.Errorf("%w: message_delta before message_start", ErrDecode)
		}
		if len(ev.Delta.StopReason) > 0 {
			a.msg["stop_reason"] = ev.Delta.StopReason
		}
		if len(ev.Delta.StopSequence) > 0 {
			a.msg["stop_sequence"] = ev.Delta.StopSequence
		}
		for k, v := range ev.Usage {
			a.setUsage(k, v)
		}
	case "message_stop":
		return true, nil
	case "error":
		return false, &midStreamError{typ: ev.Error.Type, msg: ev.Error.Message}
	}
	return false, nil // ping, content_block_stop, and event types added later
}

func (a *anthropicAssembler) delta(b *anthropicBlock, ev anthropicEvent, emit func(Delta)) {
	switch ev.Delta.Type {
	case "text_delta":
		b.text.WriteString(ev.Delta.Text)
		emit(Delta{Type: DeltaText, Index: ev.Index, Text: ev.Delta.Text})
	case "input_json_delta":
		b.json.WriteString(ev.Delta.PartialJSON)
		emit(Delta{Type: DeltaInputJSON, Index: ev.Index, Text: ev.Delta.PartialJSON})
	case "thinking_delta":
		b.text.WriteString(ev.Delta.Thinking)
		emit(Delta{Type: DeltaThinking, Index: ev.Index, Text: ev.Delta.Thinking})
	case "signature_delta":
		b.signature.WriteString(ev.Delta.Signature)
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
	if _, had := a.usage[k]; had && string(bytes.TrimSpace(v)) == "null" {
		return
	}
	a.usage[k] = v
}

func (a *anthropicAssembler) message() ([]byte, json.RawMessage, error) {
	if a.msg == nil {
		return nil, nil, fmt.Errorf("%w: stream ended without message_start", ErrDecode)
	}
	content := make([]json.RawMessage, 0, len(a.blocks))
	for _, b := range a.blocks {
		raw, err := b.block()
		if err != nil {
			return nil, nil, err
		}
		content = append(content, raw)
	}
	a.msg["content"] = mustMarshal(content)
	usage := mustMarshal(a.usage)
	a.msg["usage"] = usage
	return mustMarshal(a.msg), usage, nil
}

// block renders a content block as a non-streaming answer carries it.
func (b *anthropicBlock) block() (json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	for k, v := range b.raw {
		out[k] = v
	}
	switch b.typ {
	case "text":
		out["text"] = mustMarshal(b.text.String())
	case "thinking":
		out["thinking"] = mustMarshal(b.text.String())
		out["signature"] = mustMarshal(b.signature.String())
	case "tool_use", "server_tool_use":
		input := json.RawMessage(b.json.String())
		if len(bytes.TrimSpace(input)) == 0 {
			input = json.RawMessage("{}")
		}
		if !json.Valid(input) {
			return nil, fmt.Errorf("%w: tool input of the stream is not JSON", ErrDecode)
		}
		out["input"] = input
	}
	return mustMarshal(out), nil
}

// mustMarshal encodes values built from decoded JSON, which always encode.
func mustMarshal(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic("llm: encode assembled message: " + err.Error())
	}
	return b
}
