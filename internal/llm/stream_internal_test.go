package llm

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// anthropicStream is a Messages API stream of n text deltas, as the API (and llmsim) writes it.
func anthropicStream(n int) []byte {
	var b bytes.Buffer
	event := func(name, data string) { fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", name, data) }
	event("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":1}}}`)
	event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
	event("ping", `{"type":"ping"}`)
	for i := range n {
		event("content_block_delta", fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"tok%d "}}`, i))
	}
	event("content_block_stop", `{"type":"content_block_stop","index":0}`)
	event("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, n))
	event("message_stop", `{"type":"message_stop"}`)
	return b.Bytes()
}

// BenchmarkReadStream_Anthropic is the worker's own work per streamed answer of 100 tokens:
// reading the events, emitting the deltas (masked) and assembling the message.
func BenchmarkReadStream_Anthropic(b *testing.B) {
	benchReadStream(b, anthropicStream(100), "sk-ant-bench-key-0123456789", anthropic{}.assembler)
}

// benchReadStream reads stream, an answer of 100 deltas, with a fresh assembler each time.
func benchReadStream(b *testing.B, stream []byte, key string, assembler func() assembler) {
	c := &client{red: newRedactor(key), now: time.Now}
	ctx := context.Background()
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		deltas := 0
		sr := c.readStream(ctx, bytes.NewReader(stream), assembler(), 1<<30, nil, nil, func(Delta) { deltas++ })
		if sr.err != nil || sr.readErr != nil || deltas != 100 {
			b.Fatalf("read: %v %v, %d deltas", sr.err, sr.readErr, deltas)
		}
	}
}

// openAIStream is a Chat Completions stream of n content deltas, with the usage chunk.
func openAIStream(n int) []byte {
	var b bytes.Buffer
	chunk := func(choices, usage string) {
		fmt.Fprintf(&b, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"g","system_fingerprint":"fp_1","choices":%s,"usage":%s}`+"\n\n", choices, usage)
	}
	chunk(`[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`, "null")
	for i := range n {
		chunk(fmt.Sprintf(`[{"index":0,"delta":{"content":"tok%d "},"logprobs":null,"finish_reason":null}]`, i), "null")
	}
	chunk(`[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]`, "null")
	chunk(`[]`, fmt.Sprintf(`{"prompt_tokens":9,"completion_tokens":%d,"total_tokens":%d}`, n, n+9))
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// BenchmarkReadStream_OpenAI is BenchmarkReadStream_Anthropic for a Chat Completions stream,
// whose text chunks are read without decoding (contentChunkOf).
func BenchmarkReadStream_OpenAI(b *testing.B) {
	benchReadStream(b, openAIStream(100), "sk-bench-key-0123456789", openAI{}.assembler)
}

// TestReadStream_AnthropicAssembles reads the benchmark's stream: every delta in order, the
// message whole.
func TestReadStream_AnthropicAssembles(t *testing.T) {
	c := &client{red: newRedactor("sk-ant-bench-key-0123456789"), now: time.Now}
	var text strings.Builder
	sr := c.readStream(context.Background(), bytes.NewReader(anthropicStream(3)), anthropic{}.assembler(), 1<<30, nil, nil,
		func(d Delta) { text.WriteString(d.Text) })
	if sr.err != nil || sr.readErr != nil {
		t.Fatalf("read: %v %v", sr.err, sr.readErr)
	}
	if got := text.String(); got != "tok0 tok1 tok2 " {
		t.Fatalf("deltas %q", got)
	}
	var msg struct {
		Content []struct{ Type, Text string }
	}
	if err := json.Unmarshal(sr.body, &msg); err != nil || len(msg.Content) != 1 || msg.Content[0].Text != "tok0 tok1 tok2 " {
		t.Fatalf("message %s (%v)", sr.body, err)
	}
}

// TestTextDeltaOf proves that the text delta read without decoding is the one decoding gives,
// that the API's own form is read that way, and that any other form is left to decoding.
func TestTextDeltaOf(t *testing.T) {
	for _, tc := range []struct {
		data  string
		ok    bool
		index int
		text  string
	}{
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`, true, 0, "Hello"},
		{`{"type":"content_block_delta","index":12,"delta":{"type":"text_delta","text":""}}`, true, 12, ""},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"say \"hi\"\n\u00e9\\"}}`, true, 0, "say \"hi\"\n\u00e9\\"},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"caf` + "\xff" + `"}}`, true, 0, "caf\ufffd"},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a` + "\t" + `"}}`, false, 0, ""},
		{`{"type":"content_block_delta","index":01,"delta":{"type":"text_delta","text":"a"}}`, false, 0, ""},
		{`{"type":"content_block_delta","index":-1,"delta":{"type":"text_delta","text":"a"}}`, false, 0, ""},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{"}}`, false, 0, ""},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"},"x":1}`, false, 0, ""},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"},"delta":{"type":"text_delta","text":"b"}}`, false, 0, ""},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}} `, false, 0, ""},
		{`{"type": "content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}`, false, 0, ""},
		{`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a}}`, false, 0, ""},
	} {
		index, text, ok := textDeltaOf([]byte(tc.data))
		if ok != tc.ok || index != tc.index || text != tc.text {
			t.Errorf("textDeltaOf(%s) = %d, %q, %v; want %d, %q, %v", tc.data, index, text, ok, tc.index, tc.text, tc.ok)
		}
	}
}

// FuzzTextDeltaOf proves that whatever textDeltaOf reads is what decoding the event reads.
func FuzzTextDeltaOf(f *testing.F) {
	f.Add([]byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}`))
	f.Add([]byte(`{"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"\ud83d\ude00 \u0000"}}`))
	f.Add([]byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a","x":"b"}}`))
	f.Add([]byte(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"a"}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		index, text, ok := textDeltaOf(data)
		if !ok {
			return
		}
		var ev anthropicEvent
		if err := json.Unmarshal(data, &ev); err != nil {
			t.Fatalf("read %d, %q from %s, which does not decode: %v", index, text, data, err)
		}
		if ev.Type != "content_block_delta" || ev.Delta.Type != "text_delta" || ev.Index != index || ev.Delta.Text != text {
			t.Fatalf("read %d, %q from %s, decoded %+v", index, text, data, ev)
		}
	})
}

// TestReadStream_LongLines proves that events longer than the reader's buffer arrive whole, one
// after another (the long line's buffer is reused), and that a line past maxEventBytes fails the
// stream.
func TestReadStream_LongLines(t *testing.T) {
	c := &client{now: time.Now}
	long1, long2 := strings.Repeat("a", 40<<10), strings.Repeat("b", 20<<10)
	stream := string(anthropicStream(0))
	i := strings.Index(stream, "event: content_block_stop")
	deltaEvent := func(s string) string {
		return "event: content_block_delta\ndata: " + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"` + s + `"}}` + "\n\n"
	}
	var got []string
	sr := c.readStream(context.Background(), strings.NewReader(stream[:i]+deltaEvent(long1)+deltaEvent(long2)+stream[i:]),
		anthropic{}.assembler(), 1<<30, nil, nil, func(d Delta) { got = append(got, d.Text) })
	if sr.err != nil || sr.readErr != nil {
		t.Fatalf("read: %v %v", sr.err, sr.readErr)
	}
	if len(got) != 2 || got[0] != long1 || got[1] != long2 {
		t.Fatalf("got %d deltas of %d bytes", len(got), len(strings.Join(got, "")))
	}

	sr = c.readStream(context.Background(), strings.NewReader(stream[:i]+deltaEvent(strings.Repeat("c", maxEventBytes))+stream[i:]),
		anthropic{}.assembler(), 1<<30, nil, nil, func(Delta) {})
	if sr.readErr == nil || !strings.Contains(sr.readErr.Error(), "longer than") {
		t.Fatalf("a line past maxEventBytes: %v %v", sr.err, sr.readErr)
	}
}

// TestReadStream_EmptyDataIsNoEvent proves that an event whose data lines are empty is skipped,
// as a provider's keep-alive would be, and not handed to the assembler as an event to decode.
func TestReadStream_EmptyDataIsNoEvent(t *testing.T) {
	c := &client{now: time.Now}
	stream := string(anthropicStream(1))
	i := strings.Index(stream, "event: content_block_stop")
	var got []string
	sr := c.readStream(context.Background(), strings.NewReader(stream[:i]+"event: ping\ndata:\n\ndata: \ndata:\n\n"+stream[i:]),
		anthropic{}.assembler(), 1<<30, nil, nil, func(d Delta) { got = append(got, d.Text) })
	if sr.err != nil || sr.readErr != nil {
		t.Fatalf("read: %v %v", sr.err, sr.readErr)
	}
	if len(got) != 1 || got[0] != "tok0 " {
		t.Fatalf("deltas %q", got)
	}
}

// TestTextDeltaOf_Simulator proves that the simulator's text deltas, which the stream bench
// measures, are read without decoding: each one is read by textDeltaOf as decoding reads it.
func TestTextDeltaOf_Simulator(t *testing.T) {
	body := simStream(t, "/v1/messages", `{"model":"claude-sim","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"say \"hi\" é"}]}`,
		"x-api-key", "sk-ant-test", "anthropic-version", "2023-06-01")
	deltas := 0
	for _, ev := range strings.Split(body, "\n\n") {
		data, ok := strings.CutPrefix(ev, "event: content_block_delta\ndata: ")
		if !ok {
			continue
		}
		deltas++
		index, text, ok := textDeltaOf([]byte(data))
		var decoded anthropicEvent
		if !ok || json.Unmarshal([]byte(data), &decoded) != nil || decoded.Index != index || decoded.Delta.Text != text {
			t.Fatalf("delta %s: read %d, %q, %v; decoded %+v", data, index, text, ok, decoded)
		}
	}
	if deltas < 20 {
		t.Fatalf("%d text deltas in:\n%s", deltas, body)
	}
}

// TestReadStream_TextDeltaForUnknownBlock proves that a text delta read without decoding is
// refused as decoding refuses it when its content block was never started.
func TestReadStream_TextDeltaForUnknownBlock(t *testing.T) {
	c := &client{now: time.Now}
	stream := strings.Replace(string(anthropicStream(1)), `"index":0,"delta":{"type":"text_delta"`, `"index":1,"delta":{"type":"text_delta"`, 1)
	sr := c.readStream(context.Background(), strings.NewReader(stream), anthropic{}.assembler(), 1<<30, nil, nil, func(Delta) {})
	if !errors.Is(sr.err, ErrDecode) || !strings.Contains(sr.err.Error(), "unknown content block 1") {
		t.Fatalf("read: %v %v", sr.err, sr.readErr)
	}
}

// TestContentChunkOf: a Chat Completions chunk whose only choice adds text is read without
// decoding, whatever the top-level members around it; any other chunk or form is left to
// decoding.
func TestContentChunkOf(t *testing.T) {
	const choice = `[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]`
	for _, tc := range []struct {
		data  string
		ok    bool
		index int
		text  string
	}{
		{`{"id":"c","object":"chat.completion.chunk","created":7,"model":"g","system_fingerprint":"fp","choices":` + choice + `}`, true, 0, "Hello"},
		{`{"choices":` + choice + `,"usage":null,"service_tier":"default","obfuscation":"x{[\"y"}`, true, 0, "Hello"},
		{` { "id" : {"a":[1,{"b":"}"}]} , "choices":` + choice + ` , "error" : null } `, true, 0, "Hello"},
		{`{"choices":[{"index":3,"delta":{"content":""},"logprobs":null,"finish_reason":null}]}`, true, 3, ""},
		{`{"choices":[{"index":0,"delta":{"content":"say \"hi\"\n\u00e9\\"},"logprobs":null,"finish_reason":null}]}`, true, 0, "say \"hi\"\n\u00e9\\"},
		{`{"choices":[{"index":0,"delta":{"content":"caf` + "\xff" + `"},"logprobs":null,"finish_reason":null}]}`, true, 0, "caf\ufffd"},
		{`{"choices":` + choice + `,"usage":{"prompt_tokens":1}}`, false, 0, ""},
		{`{"choices":` + choice + `,"error":{"message":"x"}}`, false, 0, ""},
		{`{"choices":` + choice + `,"Usage":{"prompt_tokens":1}}`, false, 0, ""},
		{`{"choices":` + choice + `,"cho\u0069ces":[]}`, false, 0, ""},
		{`{"choices":` + choice + `,"choices":[]}`, false, 0, ""},
		{`{"Choices":` + choice + `}`, false, 0, ""},
		{`{"choices":[{"index":0,"delta":{"role":"assistant","content":"a"},"logprobs":null,"finish_reason":null}]}`, false, 0, ""},
		{`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":"stop"}]}`, false, 0, ""},
		{`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null},{"index":1,"delta":{"content":"b"},"logprobs":null,"finish_reason":null}]}`, false, 0, ""},
		{`{"choices":[{"index":01,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}`, false, 0, ""},
		{`{"choices":[{"index":0, "delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}`, false, 0, ""},
		{`{"choices":[{"index":0,"delta":{"content":"a","refusal":null},"logprobs":null,"finish_reason":null}]}`, false, 0, ""},
		{`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]`, false, 0, ""},
		{`{"choices":[]}`, false, 0, ""},
		{`{"id":"c"}`, false, 0, ""},
		{`[` + choice + `]`, false, 0, ""},
	} {
		index, text, ok := contentChunkOf([]byte(tc.data), nil)
		if ok != tc.ok || index != tc.index || text != tc.text {
			t.Errorf("contentChunkOf(%s) = %d, %q, %v; want %d, %q, %v", tc.data, index, text, ok, tc.index, tc.text, tc.ok)
		}
	}
}

// FuzzContentChunkOf proves that whatever contentChunkOf reads is what decoding the chunk reads:
// one choice, its index, its text, and nothing else that the assembler would take from it.
func FuzzContentChunkOf(f *testing.F) {
	f.Add([]byte(`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}`))
	f.Add([]byte(`{"choices":[{"index":2,"delta":{"content":"\ud83d\ude00 \u0000"},"logprobs":null,"finish_reason":null}],"x":{"y":"]}\""}}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}],"usage":null,"usage":{"total_tokens":1}}`))
	f.Add([]byte(`{"cHoices":[],"choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		index, text, ok := contentChunkOf(data, nil)
		if !ok {
			return
		}
		var ch openAIChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			t.Fatalf("read %d, %q from %s, which does not decode: %v", index, text, data, err)
		}
		null := func(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }
		if !null(ch.Error) || !null(ch.Usage) || len(ch.Choices) != 1 {
			t.Fatalf("read %d, %q from %s, decoded %+v", index, text, data, ch)
		}
		c := ch.Choices[0]
		if c.Index != index || c.Delta.Content == nil || *c.Delta.Content != text || c.Delta.Role != "" ||
			c.Delta.Refusal != nil || len(c.Delta.ToolCalls) != 0 || !null(c.FinishReason) ||
			c.Delta.ReasoningContent.set || c.Delta.Reasoning.set || c.Delta.Annotations != nil ||
			c.ContentFilterResults != nil {
			t.Fatalf("read %d, %q from %s, decoded %+v", index, text, data, c)
		}
	})
}

// TestContentChunkOf_Simulator proves that every text chunk llmsim streams in the Chat
// Completions format is read without decoding, as decoding reads it.
func TestContentChunkOf_Simulator(t *testing.T) {
	body := simStream(t, "/v1/chat/completions", `{"model":"gpt-sim","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"say \"hi\" é <b>"}]}`,
		"Authorization", "Bearer sk-test")
	texts := 0
	for _, ev := range strings.Split(body, "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var decoded openAIChunk
		if err := json.Unmarshal([]byte(data), &decoded); err != nil {
			t.Fatalf("chunk %s: %v", data, err)
		}
		if len(decoded.Choices) != 1 || decoded.Choices[0].Delta.Content == nil || decoded.Choices[0].Delta.Role != "" {
			continue
		}
		texts++
		index, text, ok := contentChunkOf([]byte(data), nil)
		if !ok || index != decoded.Choices[0].Index || text != *decoded.Choices[0].Delta.Content {
			t.Fatalf("chunk %s: read %d, %q, %v", data, index, text, ok)
		}
	}
	if texts < 20 {
		t.Fatalf("%d text chunks in:\n%s", texts, body)
	}
}

// simStream POSTs body to llmsim's path with the headers given as name, value pairs and returns
// the stream it answers (20 tokens).
func simStream(t *testing.T, path, body string, headers ...string) string {
	t.Helper()
	srv := httptest.NewServer(llmsim.New(llmsim.Config{ReplyTokens: 20}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d %v\n%s", resp.StatusCode, err, got)
	}
	return string(got)
}

// TestDeltaMasker_SplitsAddUpToTheMaskedText: however two blocks' texts, holding the key in
// several forms (URL-escaped, base64 at other alignments, in another case, twice in a row), are
// cut into interleaved deltas, each block's deltas add up to its text masked whole (as the
// stored body has it), and none holds a form of the key.
func TestDeltaMasker_SplitsAddUpToTheMaskedText(t *testing.T) {
	t.Parallel()
	const key = "sk-ant-api03-Zq9/x+Y=0123456789abcdef"
	red := newRedactor(key)
	b64 := base64.StdEncoding.EncodeToString([]byte("x" + key)) // key at alignment 1
	texts := []string{
		"a " + key + key + " b " + url.QueryEscape(key) + " c " + strings.ToUpper(key) + "s",
		"thinking about " + b64 + " and " + key[:10] + " (a start only) then " + key,
	}
	want := make([]string, len(texts))
	for i, text := range texts {
		b := []byte(text)
		red.maskBytes(b)
		want[i] = string(b)
		require.NotContains(t, want[i], key[10:], "the whole text is masked")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		m := deltaMasker{red: red}
		got := make([]strings.Builder, len(texts))
		emit := func(d Delta) {
			require.Empty(t, red.spans(d.Text), "a form of the key in %q", d.Text)
			got[d.Index].WriteString(d.Text)
		}
		rest := slices.Clone(texts)
		for rest[0] != "" || rest[1] != "" {
			i := rng.IntN(2)
			if rest[i] == "" {
				i = 1 - i
			}
			n := min(1+rng.IntN(12), len(rest[i]))
			if d, ok := m.mask(Delta{Type: DeltaText, Index: i, Text: rest[i][:n]}); ok {
				emit(d)
			}
			rest[i] = rest[i][n:]
		}
		m.flush(emit)
		for i := range texts {
			require.Equal(t, want[i], got[i].String(), "block %d", i)
		}
	}
}

// TestDeltaMasker_KeysEndToEndAreHandedOn: a provider echoing the key many times end to end (a
// model asked to repeat it) gets its deltas handed on as they come, masked, not held to the end
// of the stream: what the masker holds stays under two key forms, so each delta costs the same
// however long the echo, and the deltas still add up to the text masked whole.
func TestDeltaMasker_KeysEndToEndAreHandedOn(t *testing.T) {
	t.Parallel()
	const key = "sk-ant-api03-Zq9/x+Y=0123456789abcdef"
	red := newRedactor(key)
	text := strings.Repeat(key, 200) + strings.Repeat(strings.ToUpper(key), 200)
	want := []byte(text)
	red.maskBytes(want)
	bound := 2 * len(red.forms[0])
	m := deltaMasker{red: red}
	var got strings.Builder
	emit := func(d Delta) { got.WriteString(d.Text) }
	for rest := text; rest != ""; {
		n := min(7, len(rest))
		if d, ok := m.mask(Delta{Type: DeltaText, Text: rest[:n]}); ok {
			emit(d)
		}
		rest = rest[n:]
		held := m.held[deltaBlock{typ: DeltaText}]
		require.Less(t, len(held), bound, "held back after %d of %d bytes", len(text)-len(rest), len(text))
	}
	m.flush(emit)
	require.Equal(t, string(want), got.String(), "the deltas add up to the text masked whole")
	require.Empty(t, red.spans(got.String()))
}

// TestReadStream_ABlockEndsBeforeTheNext: a block's last characters that could start the key
// (held back by the masker) are handed on when the provider ends the block (Anthropic
// content_block_stop), before the deltas of the blocks after it, not at the end of the stream: a
// client shows each block complete before the next grows. An OpenAI choice's finish_reason does
// not end it (see TestReadStream_KeyAcrossAChoiceEndIsMasked): its tail goes at [DONE].
func TestReadStream_ABlockEndsBeforeTheNext(t *testing.T) {
	t.Parallel()
	c := &client{red: newRedactor("sk-ant-api03-Zq9/x+Y=0123456789abcdef"), now: time.Now}
	type piece struct {
		index int
		text  string
	}
	read := func(t *testing.T, stream string, asm assembler) []piece {
		t.Helper()
		var got []piece
		sr := c.readStream(context.Background(), strings.NewReader(stream), asm, 1<<30, nil, nil,
			func(d Delta) { got = append(got, piece{d.Index, d.Text}) })
		require.NoError(t, sr.err)
		require.NoError(t, sr.readErr)
		return got
	}

	t.Run("anthropic", func(t *testing.T) {
		var b strings.Builder
		event := func(name, data string) { fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", name, data) }
		event("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}`)
		event("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}`)
		event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"the user asks"}}`)
		event("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}`)
		event("content_block_stop", `{"type":"content_block_stop","index":0}`)
		event("content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`)
		event("content_block_delta", `{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Here it is"}}`)
		event("content_block_stop", `{"type":"content_block_stop","index":1}`)
		event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}`)
		event("message_stop", `{"type":"message_stop"}`)
		require.Equal(t, []piece{{0, "the user ask"}, {0, "s"}, {1, "Here it i"}, {1, "s"}},
			read(t, b.String(), anthropic{}.assembler()))
	})

	t.Run("openai", func(t *testing.T) {
		var b strings.Builder
		chunk := func(data string) { fmt.Fprintf(&b, "data: %s\n\n", data) }
		choice := func(i int, content, finish string) string {
			return fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":%d,"delta":{"content":%q},"logprobs":null,"finish_reason":%s}]}`, i, content, finish)
		}
		chunk(choice(0, "yes", "null"))
		chunk(choice(1, "no", "null"))
		chunk(choice(0, "", `"stop"`))
		chunk(choice(1, " thanks", "null"))
		chunk(choice(1, "", `"stop"`))
		chunk(`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":4,"total_tokens":5}}`)
		chunk("[DONE]")
		require.Equal(t, []piece{{0, "ye"}, {1, "no"}, {1, " thank"}, {0, "s"}, {1, "s"}},
			read(t, b.String(), openAI{}.assembler()))
	})
}

// TestReadStream_KeyAcrossAChoiceEndIsMasked: OpenAI-compatible servers send a non-null
// finish_reason on chunks that are not a choice's last (Ollama writes "finish_reason":"" on every
// chunk; proxies have sent "stop" on a reasoning chunk and gone on), so a finish_reason does not
// end a choice's text: a key that such a stream splits across two chunks is masked in the deltas,
// as in the stored body, and the deltas still add up to the body's text.
func TestReadStream_KeyAcrossAChoiceEndIsMasked(t *testing.T) {
	t.Parallel()
	const key = "sk-ant-api03-Zq9/x+Y=0123456789abcdef"
	c := &client{red: newRedactor(key), now: time.Now}
	var b strings.Builder
	for _, piece := range []string{"the key is ", key[:15], key[15:], " ok"} {
		fmt.Fprintf(&b, "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":%q},\"finish_reason\":\"\"}]}\n\n", piece)
	}
	b.WriteString("data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	var got strings.Builder
	sr := c.readStream(context.Background(), strings.NewReader(b.String()), openAI{}.assembler(), 1<<30, nil, nil,
		func(d Delta) { got.WriteString(d.Text) })
	require.NoError(t, sr.err)
	require.NoError(t, sr.readErr)
	require.Empty(t, c.red.spans(got.String()), "a form of the key in the deltas: %q", got.String())
	c.red.maskBytes(sr.body)
	var msg struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	require.NoError(t, json.Unmarshal(sr.body, &msg))
	require.Equal(t, msg.Choices[0].Message.Content, got.String(), "the deltas add up to the stored text")
}

// TestReadStream_DeltaAfterItsBlockStopIsRefused: the masker hands on a block's held-back tail at
// its content_block_stop, so text for that block after its stop (or after the block is started
// again) could complete a key the tail began, unmasked; the Messages API sends neither, and a
// stream that does is refused as one that cannot be assembled (as a delta for a block never
// started is), its key never handed on whole.
func TestReadStream_DeltaAfterItsBlockStopIsRefused(t *testing.T) {
	t.Parallel()
	const key = "sk-ant-api03-Zq9/x+Y=0123456789abcdef"
	c := &client{red: newRedactor(key), now: time.Now}
	const start = `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`
	for name, tc := range map[string]struct{ delta, restart string }{
		"fast":      {delta: `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%s"}}`},
		"full":      {delta: `{"index":0,"type":"content_block_delta","delta":{"type":"text_delta","text":"%s"}}`},
		"restarted": {delta: `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%s"}}`, restart: start},
	} {
		t.Run(name, func(t *testing.T) {
			var b strings.Builder
			event := func(name, data string) { fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", name, data) }
			event("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1,"output_tokens":1}}}`)
			event("content_block_start", start)
			event("content_block_delta", fmt.Sprintf(tc.delta, "the key is "+key[:15]))
			event("content_block_stop", `{"type":"content_block_stop","index":0}`)
			if tc.restart != "" {
				event("content_block_start", tc.restart)
			}
			event("content_block_delta", fmt.Sprintf(tc.delta, key[15:]))
			event("content_block_stop", `{"type":"content_block_stop","index":0}`)
			event("message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}`)
			event("message_stop", `{"type":"message_stop"}`)
			var got strings.Builder
			sr := c.readStream(context.Background(), strings.NewReader(b.String()), anthropic{}.assembler(), 1<<30, nil, nil,
				func(d Delta) { got.WriteString(d.Text) })
			require.Empty(t, c.red.spans(got.String()), "a form of the key in the deltas: %q", got.String())
			require.ErrorIs(t, sr.err, ErrDecode)
		})
	}
}

// FuzzOpenAIAssembler feeds arbitrary chunks to the Chat Completions assembler, each twice (as a
// server repeating members would), then renders the message: whatever a server sends, the
// assembler neither panics nor renders what is not JSON, and what clients saw of each tool call
// (the input_json deltas under its tool index) is the call stored at that place in the message's
// tool_calls: its id, name and arguments; the message stores no call clients did not see, and
// no empty tool_calls list.
func FuzzOpenAIAssembler(f *testing.F) {
	f.Add([]byte(`{"id":"c","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi","tool_calls":null,"reasoning_content":null},"matched_stop":null,"finish_reason":null}]}`))
	f.Add([]byte(`{"choices":[{"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{}"}}]},"stop_reason":"\n","token_ids":[1,2]}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"reasoning_details":[{"type":"reasoning.text","text":"t","index":0}]},"native_finish_reason":"stop"}],"usage":{"total_tokens":3}}`))
	f.Add([]byte(`{"choices":[null,{"index":1,"delta":{"custom":"x"},"content_filter_results":[],"Matched_Stop":1,"matched_stop":2}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{}"}},{"index":0,"id":"b","function":{"name":"f"}}]}}],"sglext":{"a":1}}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":"{"}},{"index":0,"id":"b","function":{"name":"f"}},{"index":1,"function":{"arguments":"}"}},{"index":0,"id":"c","function":{"name":"g"}},{"index":0,"function":{"arguments":"x"}}]}}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"a","function":{"name":"f"}},{"index":3,"type":"function"},{"index":-1,"id":"b","function":{"name":"g","arguments":"{}"}},{"index":1,"function":{"arguments":"{}"}}]}}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"content":"x","tool_calls":[{"index":0,"id":"","type":"function","function":{"arguments":""}}]}}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"r1","function":{"name":"g","arguments":""}},{"index":0,"id":"r2","function":{"name":"","arguments":"{"}},{"index":0,"id":"r3","function":{"name":"f"}},{"index":1,"id":"r4","function":{"arguments":"}"}},{"index":0,"id":"r5","function":{"arguments":"x"}}]}}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}},{"index":1,"function":{"arguments":"}"}},{"index":2,"id":"b","function":{"arguments":"{"}},{"index":2,"function":{"name":"g","arguments":"}"}}]}}]}`))
	f.Add([]byte(`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":""}},{"index":0,"id":"b","function":{"name":"g","arguments":""}},{"index":0,"id":"c","function":{"name":"f"}},{"index":1,"function":{"arguments":"{"}},{"index":2,"id":null,"function":{"name":"","arguments":"{}"}},{"index":1,"function":{"arguments":"}"}}]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a := openAI{}.assembler()
		type call struct{ id, name, args string }
		seen := map[[2]int]*call{} // by choice and tool index, as clients see them
		emit := func(d Delta) {
			if d.Type != DeltaInputJSON {
				return
			}
			c := seen[[2]int{d.Index, d.ToolIndex}]
			if c == nil {
				c = &call{}
				seen[[2]int{d.Index, d.ToolIndex}] = c
			}
			if d.ToolID != "" {
				c.id = d.ToolID
			}
			c.name += d.ToolName
			c.args += d.Text
		}
		for range 2 {
			if _, err := a.event("", data, emit, func(int) {}); err != nil {
				return
			}
		}
		msg, _, err := a.message()
		if err != nil {
			return
		}
		var out struct {
			Choices []struct {
				Index   int `json:"index"`
				Message struct {
					ToolCalls []struct {
						ID       string `json:"id"`
						Function *struct{ Name, Arguments string }
						Custom   *struct{ Name, Input string }
					} `json:"tool_calls"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(msg, &out); err != nil {
			t.Fatalf("rendered %s from %s: %v", msg, data, err)
		}
		for _, ch := range out.Choices {
			if ch.Message.ToolCalls != nil && len(ch.Message.ToolCalls) == 0 {
				t.Fatalf("choice %d stores an empty tool_calls list, from %s", ch.Index, data)
			}
			if a.(*openAIAssembler).choices[ch.Index].function != nil {
				continue // the legacy function_call's deltas have no tool index of their own
			}
			for k, tc := range ch.Message.ToolCalls {
				got := call{id: tc.ID}
				if f := tc.Function; f != nil {
					got.name, got.args = f.Name, f.Arguments
				} else if cu := tc.Custom; cu != nil {
					got.name, got.args = cu.Name, cu.Input
				}
				c := seen[[2]int{ch.Index, k}]
				if c == nil {
					t.Fatalf("choice %d stores %+v at %d, which no delta opened, from %s", ch.Index, got, k, data)
				}
				if got != *c {
					t.Fatalf("choice %d tool index %d: clients saw %+v, stored %+v, from %s", ch.Index, k, *c, got, data)
				}
				delete(seen, [2]int{ch.Index, k})
			}
		}
		for k := range seen {
			if a.(*openAIAssembler).choices[k[0]].function == nil {
				t.Fatalf("deltas under tool index %d of choice %d, which stores no call, from %s", k[1], k[0], data)
			}
		}
	})
}

// A top-level member that the first chunk lacked and every later chunk repeats (a server's own,
// as SGLang's weight_version) is kept once: the text chunks that repeat it are still read without
// decoding, with no more allocations than a text chunk without it (the text, and the content's
// growth).
func TestOpenAIAssembler_LateMemberRepeatedAllocs(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	const head = `{"id":"c","object":"chat.completion.chunk","created":8,"model":"g","choices":[{"index":0,"delta":{"content":"tok "},"logprobs":null,"finish_reason":null}]`
	allocs := func(chunk string) (float64, []byte) {
		return openAIChunkAllocs(t, chunk,
			`{"id":"c","object":"chat.completion.chunk","created":7,"model":"g","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			`{"id":"c","object":"chat.completion.chunk","created":7,"model":"g","choices":[],"weight_version":"v1"}`)
	}
	plain, _ := allocs(head + `}`)
	repeated, body := allocs(head + `,"weight_version":"v1","obfuscation":"x"}`)
	require.Equal(t, plain, repeated)
	require.Contains(t, string(body), `"weight_version":"v1"`)
	require.Contains(t, string(body), `"created":7`)
}

// A top-level member that the first chunk lacked and every later chunk brings at another value
// (llama.cpp's timings with timings_per_token, when the first chunk lacks it) is kept at its
// last value without costing its text chunks the reading without decoding: each costs a text
// chunk's allocations and the member's copy (its key and value), not a chunk's decoding.
func TestOpenAIAssembler_LateMemberChangingAllocs(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	const head = `{"id":"c","object":"chat.completion.chunk","created":8,"model":"g","choices":[{"index":0,"delta":{"content":"tok "},"logprobs":null,"finish_reason":null}]`
	const runs = 1000
	allocs := func(chunk func(i int) string) (float64, []byte) {
		asm := openAI{}.assembler()
		emit, end := func(Delta) {}, func(int) {}
		_, err := asm.event("", []byte(`{"id":"c","object":"chat.completion.chunk","created":7,"model":"g","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`), emit, end)
		require.NoError(t, err)
		chunks := make([][]byte, runs+1) // AllocsPerRun runs f once more, first
		for i := range chunks {
			chunks[i] = []byte(chunk(i))
		}
		i := 0
		n := testing.AllocsPerRun(runs, func() {
			if _, err := asm.event("", chunks[i], emit, end); err != nil {
				t.Fatal(err)
			}
			i++
		})
		body, _, err := asm.message()
		require.NoError(t, err)
		return n, body
	}
	plain, _ := allocs(func(int) string { return head + `}` })
	changing, body := allocs(func(i int) string { return head + fmt.Sprintf(`,"timings":{"predicted_n":%d}}`, i) })
	require.LessOrEqual(t, changing, plain+2, "a text chunk's allocations and the member's copy")
	require.Contains(t, string(body), fmt.Sprintf(`"timings":{"predicted_n":%d}`, runs))
	require.Contains(t, string(body), `"created":7`)
}

// An argument piece of a call opened at a reused index (Ollama gives parallel calls index 0) costs
// what a piece of a call at its own index costs: finding the call it goes to allocates nothing.
func TestOpenAIAssembler_ReusedIndexPieceAllocs(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	const piece = `{"id":"c","object":"chat.completion.chunk","created":7,"model":"g","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"x"}}]},"logprobs":null,"finish_reason":null}]}`
	allocs := func(opening ...string) (float64, []byte) {
		chunks := make([]string, len(opening))
		for i, call := range opening {
			chunks[i] = `{"id":"c","object":"chat.completion.chunk","created":7,"model":"g","choices":[{"index":0,"delta":{"tool_calls":[` + call + `]},"logprobs":null,"finish_reason":null}]}`
		}
		return openAIChunkAllocs(t, piece, chunks...)
	}
	own, _ := allocs(`{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}`)
	moved, body := allocs(`{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":"{}"}}`,
		`{"index":0,"id":"call_b","type":"function","function":{"name":"f","arguments":""}}`)
	require.Equal(t, own, moved)
	require.Contains(t, string(body), `"id":"call_b"`)
	require.Contains(t, string(body), `"arguments":"{}"`)
}

// headersFirstStream feeds a a stream of n parallel calls: each call's header (id, name, no
// arguments) at headerIndex(i), then each call's arguments, without id or name, at argsIndex(i).
func headersFirstStream(tb testing.TB, a assembler, n int, headerIndex, argsIndex func(i int) int) {
	tb.Helper()
	for _, part := range []string{"header", "args"} {
		for i := range n {
			call := fmt.Sprintf(`{"index":%d,"id":"call_%d","type":"function","function":{"name":"f%d","arguments":""}}`,
				headerIndex(i), i, i)
			if part == "args" {
				call = fmt.Sprintf(`{"index":%d,"function":{"arguments":"{\"n\":%d}"}}`, argsIndex(i), i)
			}
			_, err := a.event("", []byte(`{"choices":[{"index":0,"delta":{"tool_calls":[`+call+`]}}]}`),
				func(Delta) {}, func(int) {})
			require.NoError(tb, err)
		}
	}
}

// Many parallel calls whose headers come at index 0 and arguments at 1, 2... (OmniRoute's
// Responses-to-Chat translator) each get their own arguments past the first words of the bare
// calls' bits (64 calls a word). What such a stream costs against one whose calls each come at
// their own index is BenchmarkReadStream_OpenAIHeadersFirst's.
func TestOpenAIAssembler_HeadersFirstManyCalls(t *testing.T) {
	t.Parallel()
	const n = 200
	a := openAI{}.assembler()
	headersFirstStream(t, a, n, func(int) int { return 0 }, func(i int) int { return i + 1 })
	msg, _, err := a.message()
	require.NoError(t, err)
	var m struct {
		Choices []struct {
			Message struct {
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
		}
	}
	require.NoError(t, json.Unmarshal(msg, &m))
	calls := m.Choices[0].Message.ToolCalls
	require.Len(t, calls, n)
	for i, c := range calls {
		require.Equal(t, fmt.Sprintf("call_%d", i), c.ID)
		require.Equal(t, fmt.Sprintf("f%d", i), c.Function.Name)
		require.JSONEq(t, fmt.Sprintf(`{"n":%d}`, i), c.Function.Arguments, "call %d", i)
	}
}

// BenchmarkReadStream_OpenAIHeadersFirst prices a stream of 8,000 calls whose headers come at
// index 0 and arguments at 1, 2... against one whose calls each come at their own index: finding
// the call bare arguments go to must not scan the calls (a scan of every call per piece took 30
// times as long; a hostile server fits ~30,000 calls in the 32 MiB an answer may hold).
func BenchmarkReadStream_OpenAIHeadersFirst(b *testing.B) {
	const n = 8000
	for _, bc := range []struct {
		name                  string
		headerIndex, argIndex func(i int) int
	}{
		{"OwnIndex", func(i int) int { return i }, func(i int) int { return i }},
		{"HeadersFirst", func(int) int { return 0 }, func(i int) int { return i + 1 }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				headersFirstStream(b, openAI{}.assembler(), n, bc.headerIndex, bc.argIndex)
			}
		})
	}
}

// mergeObject merges a later object value into the one kept member by member, each at its last
// non-null value; anything else, or an object kept with many members, is replaced.
func TestMergeObject(t *testing.T) {
	t.Parallel()
	var many strings.Builder
	many.WriteString(`{`)
	for i := range maxMergedMembers + 1 {
		fmt.Fprintf(&many, `"k%d":%d,`, i, i)
	}
	manyObj := strings.TrimSuffix(many.String(), ",") + `}`
	for name, tc := range map[string]struct{ cur, next, want string }{
		"Disjoint":         {`{"a":1}`, `{"b":[2]}`, `{"a":1,"b":[2]}`},
		"LaterWins":        {`{"a":1,"b":2}`, `{"b":3}`, `{"a":1,"b":3}`},
		"NullKeepsCurrent": {`{"a":1}`, `{"a":null,"b":2}`, `{"a":1,"b":2}`},
		"OnlyNullAdded":    {`{"a":1}`, `{"b":null}`, `{"a":1,"b":null}`},
		"Covered":          {`{"a":1}`, `{ "a" : 2 , "b" : 3 }`, `{"a":2,"b":3}`},
		"EscapedKey":       {`{"\u0061":1}`, `{"a":2}`, `{"a":2}`},
		"NotObjects":       {`[1]`, `{"a":1}`, `{"a":1}`},
		"ObjectByString":   {`{"a":1}`, `"x"`, `"x"`},
		"ManyMembers":      {manyObj, `{"b":1}`, `{"b":1}`},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := mergeObject(json.RawMessage(tc.cur), json.RawMessage(tc.next))
			require.True(t, json.Valid(got), "%s", got)
			require.JSONEq(t, tc.want, string(got))
		})
	}
}

// BenchmarkMergeObject merges an object of maxMergedMembers members into one as large, half of
// whose members it brings again: the most a merge reads.
func BenchmarkMergeObject(b *testing.B) {
	var cur, next strings.Builder
	cur.WriteString(`{`)
	next.WriteString(`{`)
	for i := range maxMergedMembers {
		fmt.Fprintf(&cur, `"member_%d":%d,`, i, i)
		fmt.Fprintf(&next, `"member_%d":%d,`, i+maxMergedMembers/2, i)
	}
	c := json.RawMessage(strings.TrimSuffix(cur.String(), ",") + `}`)
	n := json.RawMessage(strings.TrimSuffix(next.String(), ",") + `}`)
	b.ReportAllocs()
	for b.Loop() {
		if got := mergeObject(c, n); len(got) < len(n) {
			b.Fatalf("merged %s", got)
		}
	}
}

// FuzzMergeObject merges arbitrary JSON values: the value kept is always JSON.
func FuzzMergeObject(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":{"c":2}}`), []byte(`{"b":null,"d":[3]}`))
	f.Add([]byte(`{"\u0061":1, "x" :2}`), []byte(`{ "a":null }`))
	f.Add([]byte(`{}`), []byte(`{"a":null}`))
	f.Fuzz(func(t *testing.T, cur, next []byte) {
		if !json.Valid(cur) || !json.Valid(next) || len(bytes.TrimSpace(cur)) != len(cur) || len(bytes.TrimSpace(next)) != len(next) {
			return // keepLate's values: valid JSON, as topLevelMembers hands them on
		}
		if got := mergeObject(cur, next); !json.Valid(got) {
			t.Fatalf("merged %s and %s into %s: not JSON", cur, next, got)
		}
	})
}

// openAIChunkAllocs feeds an OpenAI assembler the opening chunks, then chunk again and again: the
// allocations a read of chunk makes, and the message assembled at the end.
func openAIChunkAllocs(t *testing.T, chunk string, opening ...string) (float64, []byte) {
	t.Helper()
	asm := openAI{}.assembler()
	emit, end := func(Delta) {}, func(int) {}
	for _, data := range opening {
		_, err := asm.event("", []byte(data), emit, end)
		require.NoError(t, err)
	}
	data := []byte(chunk)
	n := testing.AllocsPerRun(1000, func() {
		if _, err := asm.event("", data, emit, end); err != nil {
			t.Fatal(err)
		}
	})
	body, _, err := asm.message()
	require.NoError(t, err)
	return n, body
}
