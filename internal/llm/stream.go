package llm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"time"
)

// The kinds of Delta.
const (
	// DeltaText is answer text: Anthropic text_delta, OpenAI delta.content.
	DeltaText = "text"
	// DeltaInputJSON is a piece of a tool call's input: Anthropic input_json_delta, OpenAI
	// delta.tool_calls[].function.arguments (or the legacy delta.function_call.arguments), or an
	// OpenAI custom tool's delta.tool_calls[].custom.input (free-form text, not JSON).
	DeltaInputJSON = "input_json"
	// DeltaThinking is Anthropic extended thinking (thinking_delta), or an OpenAI-compatible
	// server's reasoning (delta.reasoning_content, delta.reasoning, or the text and summary pieces
	// of OpenRouter's delta.reasoning_details; of a choice that has several, the one that brought
	// text first).
	DeltaThinking = "thinking"
	// DeltaRefusal is an OpenAI refusal (delta.refusal).
	DeltaRefusal = "refusal"
)

// Delta is one piece of a streamed answer, as the provider sent it (the API key masked).
type Delta struct {
	// Type is DeltaText, DeltaInputJSON, DeltaThinking or DeltaRefusal.
	Type string `json:"type"`
	// Index is the Anthropic content block index, or the OpenAI choice index.
	Index int `json:"index"`
	// ToolIndex is the OpenAI tool call's position in the choice's stored tool_calls
	// (DeltaInputJSON only): the server's index when it numbers calls 0, 1... as OpenAI does.
	// Calls take the positions in the order their first piece that brings something (an id, a
	// name or arguments) came, so a server that sends calls without index (Gemini's parallel
	// calls), gives several calls one (Ollama's parallel calls, all at 0: each new id without
	// index, or with a name at an index whose call has another id, is the next call), skips
	// indexes or starts past 0 (proxies that number calls by Anthropic's content blocks) has its
	// calls numbered as the stored message has them.
	ToolIndex int `json:"tool_index,omitempty"`
	// ToolID and ToolName are set on the first delta of a tool call (DeltaInputJSON), which may
	// carry no Text; not again when a server repeats them on the call's later pieces.
	ToolID   string `json:"tool_id,omitempty"`
	ToolName string `json:"tool_name,omitempty"`
	// Text is the text added.
	Text string `json:"text"`
}

// maxEventBytes bounds one server-sent event's line: far above any provider event.
const maxEventBytes = 1 << 20

// errStreamIncomplete: the event stream ended before the provider's end marker (Anthropic
// message_stop, OpenAI data: [DONE]): the connection was cut.
var errStreamIncomplete = errors.New("event stream ended before the answer was complete")

// assembler turns a provider's events into deltas and, at the end, the message a
// non-streaming call would have returned.
type assembler interface {
	// event takes one server-sent event (its name, "" when none, and data), emitting its deltas
	// and calling end(index) when the provider says the blocks of index are complete (an
	// Anthropic content_block_stop, after which a delta for the block is refused: no text may
	// follow a tail end hands on); it reports done at the provider's end marker and returns a
	// *StatusError for a mid-stream error event.
	event(name string, data []byte, emit func(Delta), end func(index int)) (done bool, err error)
	// message returns the assembled body and the usage object the answer is settled by: the
	// body's, less a count the stream never really reported (Anthropic message_start's
	// placeholder output, when no message_delta gave the output: Usage.OutputUnreported).
	message() (body []byte, usage json.RawMessage, err error)
	// usageSoFar returns the usage object the events so far reported (Anthropic message_start's,
	// updated by message_delta, less its placeholder output as message's; OpenAI's usage chunk),
	// nil when none did: what a stream that failed before its end marker is known to have
	// counted.
	usageSoFar() json.RawMessage
	// kept returns about how many bytes of the events so far the assembler keeps (the pieces
	// message builds on), at least as many as it holds: a stream's bytes are many times its
	// answer's (each Chat Completions chunk repeats the envelope, ~300 bytes for a token).
	kept() int64
}

// isEventStream reports whether h announces text/event-stream.
func isEventStream(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "text/event-stream"
}

// withStreamUsage asks OpenAI for the usage of a stream (stream_options.include_usage) when the
// body does not say: the token limiter needs it, and the stored message has it as a non-streaming
// answer does. A stream_options that sets no include_usage ({"include_obfuscation":false}, {},
// null) gets it too; an include_usage the client set is kept, as is anything else.
func withStreamUsage(body []byte, top map[string]json.RawMessage) []byte {
	raw, ok := top["stream_options"]
	if !ok {
		i := bytes.IndexByte(body, '{')
		out := make([]byte, 0, len(body)+40)
		out = append(out, body[:i+1]...)
		out = append(out, `"stream_options":{"include_usage":true},`...)
		return append(out, body[i+1:]...)
	}
	var opts map[string]json.RawMessage
	if json.Unmarshal(raw, &opts) != nil {
		return body // not an object: the provider judges it
	}
	if _, set := opts["include_usage"]; set {
		return body
	}
	// The member the decoder read: the last one of that name (written without escapes: one
	// written with them is left as it is).
	start, end := -1, -1
	topLevelMembers(body, func(key, value []byte) bool {
		if string(key) == "stream_options" {
			start = cap(body) - cap(value) // value is a slice of body
			end = start + len(value)
		}
		return true
	})
	if start < 0 {
		return body
	}
	value := `{"include_usage":true}`
	if inner := bytes.TrimSpace(body[start+1 : end-1]); body[start] == '{' && len(inner) > 0 {
		value = `{"include_usage":true,` + string(body[start+1:end])
	}
	out := make([]byte, 0, len(body)+len(value))
	out = append(out, body[:start]...)
	out = append(out, value...)
	return append(out, body[end:]...)
}

// streamRead is what reading a stream came to.
type streamRead struct {
	body    []byte
	usage   json.RawMessage
	first   time.Time // the first delta (or the end, when none came)
	readErr error     // the transport failed (or the stream was cut)
	err     error     // a mid-stream error event (*StatusError) or a stream we cannot use
}

// readStream reads an event stream to its end marker, emitting deltas with their text masked,
// and assembles the message. firstByte, when set, is stopped by the first delta: generation has
// started. What it keeps counts against limit and hold: the assembler's pieces (asm.kept) and the
// line buffers, then the message built; not every byte read, which for a long answer are many
// times its body (an endless stream of pings or comments is ended by ctx's deadline).
func (c *client) readStream(ctx context.Context, r io.Reader, asm assembler, limit int64, hold *answerHold,
	firstByte *time.Timer, onDelta func(Delta)) streamRead {
	var out streamRead
	masker := deltaMasker{red: c.red}
	emit := func(d Delta) {
		if out.first.IsZero() {
			out.first = c.now()
			if firstByte != nil {
				firstByte.Stop()
			}
		}
		if onDelta == nil {
			return
		}
		if d, ok := masker.mask(d); ok {
			onDelta(d)
		}
	}
	end := func(index int) {
		if onDelta != nil {
			masker.flushIndex(index, onDelta)
		}
	}
	br := bufio.NewReaderSize(r, 16<<10)
	var name string
	var data, long []byte // data is reused from event to event: the assemblers keep none of it
	bufSize := int64(br.Size())
	atEOF := false
	for {
		line, err := readLine(br, &long)
		kept := asm.kept() + bufSize + int64(cap(long)+cap(data))
		if kept > limit {
			out.err = fmt.Errorf("llm: read response stream: %w (limit %d bytes)", ErrResponseTooLarge, limit)
			return out
		}
		if gerr := hold.grow(ctx, max(kept-hold.size(), 0)); gerr != nil {
			out.readErr = gerr
			return out
		}
		if errors.Is(err, io.EOF) && len(data) > 0 {
			// The last event lacks its blank line: it is complete all the same, if it parses.
			line, err, atEOF = nil, nil, true
		}
		if err != nil {
			out.readErr = err
			if errors.Is(err, io.EOF) {
				out.readErr = errStreamIncomplete
			}
			return out
		}
		switch {
		case len(line) == 0: // the event is complete
			if len(data) == 0 { // no data, or only empty data lines: no event
				name = ""
				continue
			}
			done, everr := asm.event(name, data, emit, end)
			name, data = "", data[:0]
			if everr != nil {
				var mse *midStreamError
				if atEOF && !errors.As(everr, &mse) {
					// The connection ended inside the event's line (a body delimited by the
					// connection's close): a cut stream, which heals, not a bad answer.
					out.readErr = errStreamIncomplete
					return out
				}
				out.err = everr
				return out
			}
			if done {
				if onDelta != nil {
					masker.flush(onDelta)
				}
				out.body, out.usage, out.err = asm.message()
				if int64(len(out.body)) > limit {
					out.body, out.err = nil, fmt.Errorf("llm: assemble response stream: %w (limit %d bytes)", ErrResponseTooLarge, limit)
					return out
				}
				// The body is built beside the pieces it came from; finishStream settles on it.
				if gerr := hold.grow(ctx, int64(cap(out.body))); gerr != nil {
					out.body, out.readErr = nil, gerr
					return out
				}
				if out.first.IsZero() {
					out.first = c.now()
				}
				return out
			}
		case line[0] == ':': // a comment
		default:
			field, value, _ := bytes.Cut(line, []byte(":"))
			value = bytes.TrimPrefix(value, []byte(" "))
			switch string(field) {
			case "event":
				name = eventName(value)
			case "data":
				if len(data) > 0 {
					data = append(data, '\n')
				}
				data = append(data, value...)
			}
		}
	}
}

// eventName returns an event's name, without allocating for the names the providers send per
// token.
func eventName(b []byte) string {
	for _, n := range [...]string{"content_block_delta", "ping"} {
		if string(b) == n {
			return n
		}
	}
	return string(b)
}

// readLine reads one line without its end (LF or CRLF), at most maxEventBytes. The line is
// valid until the next read of br: a line that fits br's buffer is returned from it, a longer one
// is assembled in *long.
func readLine(br *bufio.Reader, long *[]byte) ([]byte, error) {
	part, isPrefix, err := br.ReadLine()
	if err != nil || !isPrefix {
		return part, err
	}
	line := append((*long)[:0], part...)
	defer func() { *long = line[:0] }()
	for {
		part, isPrefix, err := br.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, part...)
		if len(line) > maxEventBytes {
			return nil, fmt.Errorf("server-sent event line longer than %d bytes", maxEventBytes)
		}
		if !isPrefix {
			return line, nil
		}
	}
}

// deltaBlock is the text a delta adds to: a content block, or a choice's content or tool call.
type deltaBlock struct {
	typ              string
	index, toolIndex int
}

// deltaMasker masks the API key in a stream's deltas as the assembled body has it masked: byte
// for byte, in each block's text as a whole, so that a key split across deltas is masked too,
// and the deltas of a block add up to its text in the body. Of each block's text it holds back,
// until the block's next delta, the block's end (flushIndex) or the stream's end (flush), the
// tail that the next delta may complete into the key, from the start of the key it overlaps, if
// any. What it holds is shorter
// than two key forms, so that a delta costs the same however long the stream (a key echoed end
// to end included).
type deltaMasker struct {
	red    redactor
	held   map[deltaBlock]string
	blocks []deltaBlock // the blocks that held text, in the order they first did
}

// mask returns d with its block's held text before its own, masked, less the tail it now holds;
// ok is false when nothing is left to hand on (d added text, all of it held).
func (m *deltaMasker) mask(d Delta) (_ Delta, ok bool) {
	if len(m.red.forms) == 0 {
		return d, true
	}
	k := deltaBlock{typ: d.Type, index: d.Index, toolIndex: d.ToolIndex}
	held, had := m.held[k]
	text := held + d.Text
	cut := len(text) - m.red.startTail(text)
	spans := m.red.spans(text)
	for _, sp := range spans {
		if sp[0] < cut && cut < sp[1] {
			cut = sp[0]
		}
	}
	switch {
	case cut < len(text) && !had:
		if m.held == nil {
			m.held = map[deltaBlock]string{}
		}
		if !slices.Contains(m.blocks, k) {
			m.blocks = append(m.blocks, k)
		}
		m.held[k] = text[cut:]
	case cut < len(text):
		m.held[k] = text[cut:]
	case had:
		delete(m.held, k)
	}
	added := d.Text != ""
	d.Text = text[:cut]
	if len(spans) > 0 {
		b := []byte(d.Text)
		m.red.maskBytes(b)
		d.Text = string(b)
	}
	return d, d.Text != "" || !added || d.ToolID != "" || d.ToolName != ""
}

// flushIndex hands on the text the blocks of index hold, masked: the provider said they are
// complete (Anthropic content_block_stop), so that their last characters come before the deltas
// of the blocks after them, not at the end of the stream. The caller must hand on no later text
// of those blocks: it could complete the key the flushed tail began.
func (m *deltaMasker) flushIndex(index int, emit func(Delta)) {
	kept := m.blocks[:0]
	for _, k := range m.blocks {
		if k.index != index {
			kept = append(kept, k)
			continue
		}
		if held, ok := m.held[k]; ok {
			delete(m.held, k)
			b := []byte(held)
			m.red.maskBytes(b)
			emit(Delta{Type: k.typ, Index: k.index, ToolIndex: k.toolIndex, Text: string(b)})
		}
	}
	clear(m.blocks[len(kept):])
	m.blocks = kept
}

// flush hands on the text every block holds, masked: the stream is complete.
func (m *deltaMasker) flush(emit func(Delta)) {
	for _, k := range m.blocks {
		held, ok := m.held[k]
		if !ok {
			continue
		}
		b := []byte(held)
		m.red.maskBytes(b)
		emit(Delta{Type: k.typ, Index: k.index, ToolIndex: k.toolIndex, Text: string(b)})
	}
	clear(m.held)
	m.blocks = m.blocks[:0]
}

// streamError is the *StatusError of a mid-stream error event: the HTTP status was 200, so the
// status is the one the provider gives that error type before a stream starts (errorTypeStatus).
func (c *client) streamError(typ, code, msg string, header http.Header, rl RateLimit, latency, ttfb time.Duration) *StatusError {
	se := c.answerError(typ, code, msg, header, rl, latency, ttfb)
	se.MidStream = true
	return se
}

// answerError is the *StatusError of an error the provider sent under a 2xx status, in an event
// stream or as a whole body: its status is the one the provider gives that error type
// (errorTypeStatus), and every text is cleaned.
func (c *client) answerError(typ, code, msg string, header http.Header, rl RateLimit, latency, ttfb time.Duration) *StatusError {
	typ, code = c.red.clean(typ, maxHeaderTextLen), c.red.clean(code, maxHeaderTextLen)
	return &StatusError{
		StatusCode:      errorTypeStatus(typ),
		Type:            typ,
		Code:            code,
		Message:         c.red.clean(msg, maxMessageLen),
		Header:          header,
		RateLimit:       rl,
		Latency:         latency,
		TimeToFirstByte: ttfb,
	}
}

// errorTypeStatus is the HTTP status the providers give an error type; 500 for a type they do not
// document. A rate limit signalled under a 2xx carries no Retry-After; it is reported as 503
// (retry with backoff), not as a 429 that would read as a spend cap.
func errorTypeStatus(typ string) int {
	status := http.StatusInternalServerError
	switch typ {
	case "overloaded_error":
		status = 529
	case "timeout_error":
		status = http.StatusGatewayTimeout
	case "rate_limit_error", "requests", "tokens":
		status = http.StatusServiceUnavailable
	case "invalid_request_error":
		status = http.StatusBadRequest
	case "authentication_error":
		status = http.StatusUnauthorized
	case "permission_error":
		status = http.StatusForbidden
	case "not_found_error":
		status = http.StatusNotFound
	case "request_too_large":
		status = http.StatusRequestEntityTooLarge
	case "billing_error", "insufficient_quota":
		status = http.StatusPaymentRequired
	}
	return status
}

// midStreamError is a provider's error event, before it is made a *StatusError.
type midStreamError struct {
	typ, code, msg string
}

func (e *midStreamError) Error() string { return "llm: stream error event " + e.typ + ": " + e.msg }

// usageSoFar is the usage the events asm read reported; zero when none did.
func (c *client) usageSoFar(asm assembler) Usage {
	raw := asm.usageSoFar()
	if len(raw) == 0 {
		return Usage{}
	}
	return c.d.usage(raw)
}

// finishStream reads a 2xx event stream and returns the assembled answer as a non-streaming
// call would: Body the message (the key masked), Usage from the stream's usage, TimeToFirstByte
// the time to the first delta. A mid-stream error event is a *StatusError (MidStream), a cut
// stream a *TransportError, each with the Usage the events before reported and the time to the
// first delta (the TransportError's only when one came); a stream we cannot
// assemble an ErrDecode with the *Response.
func (c *client) finishStream(ctx context.Context, resp *http.Response, limit int64, hold *answerHold,
	firstByte *time.Timer, onDelta func(Delta), start time.Time, rl RateLimit) (*Response, error) {
	asm := c.d.assembler()
	sr := c.readStream(ctx, resp.Body, asm, limit, hold, firstByte, onDelta)
	latency := max(c.now().Sub(start), 0)
	ttfb := latency
	if !sr.first.IsZero() {
		ttfb = min(max(sr.first.Sub(start), 0), latency)
	}
	header := c.red.header(resp.Header)
	var mse *midStreamError
	switch {
	case sr.readErr != nil:
		err := c.transportError(ctx, "read response stream", sr.readErr)
		var te *TransportError
		if errors.As(err, &te) {
			te.Usage, te.StatusCode = c.usageSoFar(asm), resp.StatusCode
			if !sr.first.IsZero() {
				te.TimeToFirstByte = ttfb
			}
		}
		return nil, err
	case errors.As(sr.err, &mse):
		se := c.streamError(mse.typ, mse.code, mse.msg, header, rl, latency, ttfb)
		se.Usage = c.usageSoFar(asm)
		return nil, se
	}
	out := &Response{StatusCode: resp.StatusCode, Header: header, RateLimit: rl, Latency: latency, TimeToFirstByte: ttfb}
	if sr.err != nil {
		return out, sr.err
	}
	c.red.maskBytes(sr.body)
	if !isJSONObject(sr.body) {
		return out, fmt.Errorf("llm: assemble %d response stream: %w", resp.StatusCode, ErrDecode)
	}
	out.Body = sr.body
	hold.settle(int64(cap(sr.body)))
	out.hold = hold
	out.Usage = c.d.usage(sr.usage)
	return out, nil
}
