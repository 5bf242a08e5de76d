package llmsim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
	"unicode/utf8"
)

// streamAnswer is a successful answer to a request with "stream": true, sent as Server-Sent
// Events in the provider's format (see writeStream).
type streamAnswer struct {
	p            provider
	r            reply
	includeUsage bool          // OpenAI stream_options.include_usage
	interval     time.Duration // between content tokens; 0: no wait
	toolWhole    bool          // Config.StreamToolInputWhole
	toolsAtZero  bool          // Config.StreamToolCallsAtIndexZero
	toolsFrom    int           // Config.StreamToolCallsFromIndex
	namesAt      int           // Config.StreamToolNamesAtIndex
	headersFirst bool          // Config.StreamToolHeadersFirst
	// fail, when set, is the fault that ends this stream early.
	fail *streamFault
}

// streamFault ends a stream after `after` content tokens, the way mode says.
type streamFault struct {
	after int
	mode  string
}

// streamWriter writes one stream's events, flushing each.
type streamWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

// event writes one SSE event; name "" writes a data-only event (OpenAI).
func (sw streamWriter) event(name string, data []byte) error {
	var err error
	if name != "" {
		_, err = fmt.Fprintf(sw.w, "event: %s\ndata: %s\n\n", name, data)
	} else {
		_, err = fmt.Fprintf(sw.w, "data: %s\n\n", data)
	}
	if err != nil {
		return err
	}
	return sw.rc.Flush()
}

// streamer renders one provider's stream: its opening events, one content token, its closing
// events and its mid-stream error.
type streamer interface {
	open(sw streamWriter, s *streamAnswer) error
	token(sw streamWriter, s *streamAnswer, text string) error
	close(sw streamWriter, s *streamAnswer) error
	fail(sw streamWriter, s *streamAnswer) error
}

// splitTokens cuts text into content tokens of 4 bytes (the token rule), never inside a rune.
func splitTokens(text string) []string { return splitPieces(text, 4) }

// writeStream sends s: the headers, the opening events, the content tokens paced by
// s.interval, and the closing events, or the fault. A cut connection panics with
// http.ErrAbortHandler, which net/http turns into a dropped connection. Write errors mean the
// client left.
func writeStream(ctx context.Context, w http.ResponseWriter, a answer) {
	h := w.Header()
	for k, v := range a.header {
		h[k] = v
	}
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	sw := streamWriter{w: w, rc: http.NewResponseController(w)}
	_ = sw.rc.Flush()
	if a.slow > 0 && sleep(ctx, a.slow) != nil {
		return
	}
	s := a.stream
	st := s.p.streamer()
	if st.open(sw, s) != nil {
		return
	}
	for i, tok := range splitTokens(s.r.text) {
		if s.fail != nil && i == s.fail.after {
			failStream(ctx, sw, st, s)
			return
		}
		if i > 0 && sleep(ctx, s.interval) != nil {
			return
		}
		if st.token(sw, s, tok) != nil {
			return
		}
	}
	if s.fail != nil {
		failStream(ctx, sw, st, s)
		return
	}
	_ = st.close(sw, s)
}

func failStream(ctx context.Context, sw streamWriter, st streamer, s *streamAnswer) {
	switch s.fail.mode {
	case StreamFailCut:
		panic(http.ErrAbortHandler)
	case StreamFailStall:
		<-ctx.Done()
	default:
		_ = st.fail(sw, s)
	}
}

// anthropicStreamer writes the Messages API stream: message_start, content_block_start, ping,
// content_block_delta (text_delta) per token, content_block_stop, message_delta (stop_reason,
// usage), message_stop; a failure is an "error" event with overloaded_error.
type anthropicStreamer struct{}

func (anthropic) streamer() streamer { return anthropicStreamer{} }

func (anthropicStreamer) open(sw streamWriter, s *streamAnswer) error {
	type usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	}
	type message struct {
		ID           string   `json:"id"`
		Type         string   `json:"type"`
		Role         string   `json:"role"`
		Model        string   `json:"model"`
		Content      []string `json:"content"`
		StopReason   *string  `json:"stop_reason"`
		StopSequence *string  `json:"stop_sequence"`
		Usage        usage    `json:"usage"`
	}
	start := mustJSON(struct {
		Type    string  `json:"type"`
		Message message `json:"message"`
	}{"message_start", message{ID: s.r.id, Type: "message", Role: "assistant", Model: s.r.model,
		Content: []string{}, Usage: usage{InputTokens: s.r.inputTokens, OutputTokens: 1}}})
	if err := sw.event("message_start", start); err != nil {
		return err
	}
	if err := sw.event("content_block_start",
		[]byte(`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)); err != nil {
		return err
	}
	return sw.event("ping", []byte(`{"type":"ping"}`))
}

func (anthropicStreamer) token(sw streamWriter, _ *streamAnswer, text string) error {
	type delta struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	return sw.event("content_block_delta", mustJSON(struct {
		Type  string `json:"type"`
		Index int    `json:"index"`
		Delta delta  `json:"delta"`
	}{"content_block_delta", 0, delta{"text_delta", text}}))
}

func (anthropicStreamer) close(sw streamWriter, s *streamAnswer) error {
	if err := sw.event("content_block_stop", []byte(`{"type":"content_block_stop","index":0}`)); err != nil {
		return err
	}
	for i := range s.r.tools {
		if err := anthropicToolBlock(sw, 1+i, &s.r.tools[i], s.toolWhole); err != nil {
			return err
		}
	}
	msgDelta := mustJSON(map[string]any{
		"type":  "message_delta",
		"delta": map[string]any{"stop_reason": s.r.stopReason(), "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": s.r.outputTokens},
	})
	if err := sw.event("message_delta", msgDelta); err != nil {
		return err
	}
	return sw.event("message_stop", []byte(`{"type":"message_stop"}`))
}

// anthropicToolBlock writes the tool_use block of index i: its start with an empty input, its
// input JSON in input_json_delta pieces, its stop; whole, its start with the input and its stop.
func anthropicToolBlock(sw streamWriter, i int, t *toolCall, whole bool) error {
	input, pieces := json.RawMessage(`{}`), splitPieces(t.input, 8)
	if whole {
		input, pieces = json.RawMessage(t.input), nil
	}
	start := mustJSON(map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{
		"type": "tool_use", "id": t.id, "name": t.name, "input": input}})
	if err := sw.event("content_block_start", start); err != nil {
		return err
	}
	for _, piece := range pieces {
		d := mustJSON(map[string]any{"type": "content_block_delta", "index": i,
			"delta": map[string]string{"type": "input_json_delta", "partial_json": piece}})
		if err := sw.event("content_block_delta", d); err != nil {
			return err
		}
	}
	return sw.event("content_block_stop", []byte(fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, i)))
}

// splitPieces cuts s into pieces of about n bytes, never inside a rune.
func splitPieces(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		k := min(n, len(s))
		for k < len(s) && !utf8.RuneStart(s[k]) {
			k++
		}
		out = append(out, s[:k])
		s = s[k:]
	}
	return out
}

func (anthropicStreamer) fail(sw streamWriter, _ *streamAnswer) error {
	return sw.event("error", []byte(`{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`))
}

// openAIStreamer writes the Chat Completions stream: data-only chat.completion.chunk events (a
// first with the role, one per token, one with finish_reason, and with include_usage a last one
// with empty choices and the usage), then "data: [DONE]"; a failure is a data chunk
// {"error":{...}} with type server_error.
type openAIStreamer struct{}

func (openAI) streamer() streamer { return openAIStreamer{} }

// chunk renders one chat.completion.chunk; delta nil writes empty choices (the usage chunk).
func (openAIStreamer) chunk(s *streamAnswer, delta map[string]any, finish *string, usage any) []byte {
	type choice struct {
		Index        int            `json:"index"`
		Delta        map[string]any `json:"delta"`
		Logprobs     *string        `json:"logprobs"`
		FinishReason *string        `json:"finish_reason"`
	}
	choices := []choice{}
	if delta != nil {
		choices = append(choices, choice{Delta: delta, FinishReason: finish})
	}
	c := map[string]any{
		"id": s.r.id, "object": "chat.completion.chunk", "created": s.r.created.Unix(), "model": s.r.model,
		"system_fingerprint": nil, "choices": choices,
	}
	if s.includeUsage {
		c["usage"] = usage // null on every chunk but the last, as the API sends it
	}
	return mustJSON(c)
}

func (o openAIStreamer) open(sw streamWriter, s *streamAnswer) error {
	return sw.event("", o.chunk(s, map[string]any{"role": "assistant", "content": "", "refusal": nil}, nil, nil))
}

func (o openAIStreamer) token(sw streamWriter, s *streamAnswer, text string) error {
	return sw.event("", o.chunk(s, map[string]any{"content": text}, nil, nil))
}

func (o openAIStreamer) close(sw streamWriter, s *streamAnswer) error {
	tools := s.r.tools
	if s.headersFirst && !s.toolsAtZero {
		if err := o.toolsHeadersFirst(sw, s); err != nil {
			return err
		}
		tools = nil // streamed
	}
	for i, t := range tools {
		args, pieces := "", splitPieces(t.input, 8)
		if s.toolWhole || s.toolsAtZero {
			args, pieces = t.input, nil
		}
		i += s.toolsFrom
		if s.toolsAtZero {
			i = 0
		}
		if s.namesAt > 0 && !s.toolsAtZero {
			if err := o.toolApart(sw, s, t); err != nil {
				return err
			}
			continue
		}
		first := map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": t.id, "type": "function",
			"function": map[string]string{"name": t.name, "arguments": args}}}}
		if err := sw.event("", o.chunk(s, first, nil, nil)); err != nil {
			return err
		}
		for _, piece := range pieces {
			d := map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]string{"arguments": piece}}}}
			if err := sw.event("", o.chunk(s, d, nil, nil)); err != nil {
				return err
			}
		}
	}
	finish := s.r.finishReason()
	if err := sw.event("", o.chunk(s, map[string]any{}, &finish, nil)); err != nil {
		return err
	}
	if s.includeUsage {
		usage := map[string]int{"prompt_tokens": s.r.inputTokens, "completion_tokens": s.r.outputTokens,
			"total_tokens": s.r.inputTokens + s.r.outputTokens}
		if err := sw.event("", o.chunk(s, nil, nil, usage)); err != nil {
			return err
		}
	}
	return sw.event("", []byte("[DONE]"))
}

// toolApart streams the call t as Config.StreamToolNamesAtIndex says: its name at that index,
// then its arguments (in pieces, or whole with Config.StreamToolInputWhole) at index 0, each
// piece under the call's id with a number of its own.
func (o openAIStreamer) toolApart(sw streamWriter, s *streamAnswer, t toolCall) error {
	pieces := splitPieces(t.input, 8)
	if s.toolWhole {
		pieces = []string{t.input}
	}
	for n, piece := range append([]string{""}, pieces...) {
		index, name := 0, ""
		if n == 0 {
			index, name = s.namesAt, t.name
		}
		d := map[string]any{"tool_calls": []any{map[string]any{"index": index, "id": fmt.Sprintf("%s_%d", t.id, n),
			"type": "function", "function": map[string]string{"name": name, "arguments": piece}}}}
		if err := sw.event("", o.chunk(s, d, nil, nil)); err != nil {
			return err
		}
	}
	return nil
}

// toolsHeadersFirst streams the calls as Config.StreamToolHeadersFirst says: every call's id and
// name at index 0, then each call's whole arguments, without id or name, at index 1, 2...
func (o openAIStreamer) toolsHeadersFirst(sw streamWriter, s *streamAnswer) error {
	for _, t := range s.r.tools {
		d := map[string]any{"tool_calls": []any{map[string]any{"index": 0, "id": t.id, "type": "function",
			"function": map[string]string{"name": t.name, "arguments": ""}}}}
		if err := sw.event("", o.chunk(s, d, nil, nil)); err != nil {
			return err
		}
	}
	for i, t := range s.r.tools {
		d := map[string]any{"tool_calls": []any{map[string]any{"index": i + 1,
			"function": map[string]string{"arguments": t.input}}}}
		if err := sw.event("", o.chunk(s, d, nil, nil)); err != nil {
			return err
		}
	}
	return nil
}

func (openAIStreamer) fail(sw streamWriter, _ *streamAnswer) error {
	return sw.event("", []byte(`{"error":{"message":"The server had an error while processing your request. Sorry about that! (llmsim stream fault)","type":"server_error","param":null,"code":null}}`))
}
