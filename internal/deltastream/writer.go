package deltastream

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Delta is one piece of an attempt's output, as the provider adapter reads it.
type Delta struct {
	// Type is the piece's kind: "text", "input_json", "thinking", "refusal".
	Type string
	// Index is the content block (Anthropic) or choice (OpenAI).
	Index int
	// ToolIndex is the OpenAI tool call index.
	ToolIndex int
	// ToolID and ToolName open a tool call.
	ToolID   string
	ToolName string
	// Text is the text added.
	Text string
}

// maxMerged bounds the text of one entry made of merged pieces.
const maxMerged = 16 << 10

// deltaData is a delta entry's JSON.
type deltaData struct {
	Attempt   int    `json:"attempt"`
	Offset    int    `json:"offset"`
	Type      string `json:"type"`
	Index     int    `json:"index"`
	ToolIndex int    `json:"tool_index,omitempty"`
	ToolID    string `json:"tool_id,omitempty"`
	ToolName  string `json:"tool_name,omitempty"`
	Text      string `json:"text"`
}

// Writer writes one attempt's deltas to its job's buffer. Add may be called from one goroutine
// at a time; Close and Reset after the last Add.
type Writer struct {
	b       *Buffer
	job     string
	seq     int
	attempt int

	mu      sync.Mutex
	pending []deltaData
	offset  int // bytes of text added so far
	n       int // entries numbered so far
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
	closed  bool
	written int // entries written to Redis (by the flusher; read after done)
}

// Writer starts the writer of an attempt of job id: seq is the job's event sequence number of
// the attempt's running event, attempt its number. Call Close when the attempt's call returns.
func (b *Buffer) Writer(id string, seq, attempt int) *Writer {
	w := &Writer{b: b, job: id, seq: seq, attempt: attempt,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

// Add queues d; it never blocks on Redis. Consecutive pieces of one block are merged.
func (w *Writer) Add(d Delta) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	if k := len(w.pending) - 1; k >= 0 && d.ToolID == "" && d.ToolName == "" {
		p := &w.pending[k]
		if p.Type == d.Type && p.Index == d.Index && p.ToolIndex == d.ToolIndex && len(p.Text)+len(d.Text) <= maxMerged {
			p.Text += d.Text
			w.offset += len(d.Text)
			w.mu.Unlock()
			w.signal()
			return
		}
	}
	w.pending = append(w.pending, deltaData{Attempt: w.attempt, Offset: w.offset, Type: d.Type, Index: d.Index,
		ToolIndex: d.ToolIndex, ToolID: d.ToolID, ToolName: d.ToolName, Text: d.Text})
	w.offset += len(d.Text)
	w.mu.Unlock()
	w.signal()
}

func (w *Writer) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run writes what accumulated, one batch at a time, until Close.
func (w *Writer) run() {
	defer close(w.done)
	for {
		select {
		case <-w.wake:
			w.flush()
		case <-w.stop:
			w.flush()
			return
		}
	}
}

// flush writes the pending pieces as entries, then trims, sets the TTL and publishes them to the
// readers, in one round trip. A failed write is logged and its pieces dropped.
func (w *Writer) flush() {
	w.mu.Lock()
	batch := w.pending
	w.pending = nil
	first := w.n + 1
	w.n += len(batch)
	w.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	values := make([]entryValues, len(batch))
	for i, d := range batch {
		data, _ := json.Marshal(d) // plain fields: cannot fail
		values[i] = entryValues{seq: w.seq, n: first + i, kind: KindDelta, data: data}
	}
	if err := w.b.write(w.job, values); err != nil {
		w.b.cfg.Logger.Warn("write stream deltas", "job_id", w.job, "attempt", w.attempt, "error", err)
		return
	}
	w.written += len(batch)
}

// Close writes what is pending and stops the writer; it returns once everything added is in
// Redis (or its write failed), or when ctx ends. Safe to call more than once.
func (w *Writer) Close(ctx context.Context) {
	w.mu.Lock()
	already := w.closed
	w.closed = true
	w.mu.Unlock()
	if !already {
		close(w.stop)
	}
	select {
	case <-w.done:
	case <-ctx.Done():
	}
}

// Streamed reports whether any entry of the attempt reached the buffer. Call after Close.
func (w *Writer) Streamed() bool {
	select {
	case <-w.done:
		return w.written > 0
	default:
		return false
	}
}

// Reset closes the writer and, when the attempt streamed, appends a reset entry: the clients
// drop what they showed, a retry starts over. Call it before the retry is recorded, so that the
// reset precedes the job's next status event.
func (w *Writer) Reset(ctx context.Context) {
	w.Close(ctx)
	if !w.Streamed() {
		return
	}
	data, _ := json.Marshal(struct {
		Attempt int `json:"attempt"`
	}{w.attempt})
	w.n++
	if err := w.b.write(w.job, []entryValues{{seq: w.seq, n: w.n, kind: KindReset, data: data}}); err != nil {
		w.b.cfg.Logger.Warn("write stream reset", "job_id", w.job, "attempt", w.attempt, "error", err)
	}
}

// write appends entries to job id's buffer, trims it, sets its TTL and publishes the entries, in
// one round trip (writeScript).
func (b *Buffer) write(id string, values []entryValues) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.WriteTimeout)
	defer cancel()
	args := make([]any, 0, 2+4*len(values))
	args = append(args, b.cfg.MaxLen, b.cfg.TTL.Milliseconds())
	for _, v := range values {
		args = append(args, v.seq, v.n, v.kind, v.data)
	}
	return writeScript.Run(ctx, b.cfg.Redis, []string{b.Key(id)}, args...).Err()
}

// entryValues are one entry's fields.
type entryValues struct {
	seq, n int
	kind   string
	data   []byte
}

// writeScript appends entries to a job's buffer, trims it, sets its TTL and publishes them on the
// job's channel, atomically: a reader sees a batch whole or not at all, in the buffer and on the
// channel alike.
//
// KEYS[1] the buffer (its name is also the channel's). ARGV[1] MaxLen, ARGV[2] TTL ms, then four
// per entry: seq, n, kind, data (JSON). The message is a batch's JSON (see hub.go): the entries
// with the IDs the buffer gave them. The pieces are the writer's own (numbers, a kind, JSON it
// encoded), so they are concatenated as they are.
var writeScript = redis.NewScript(`
local key = KEYS[1]
local parts = {}
for i = 3, #ARGV, 4 do
  local id = redis.call('XADD', key, 'MAXLEN', '~', ARGV[1], '*', 's', ARGV[i], 'n', ARGV[i + 1],
    'k', ARGV[i + 2], 'd', ARGV[i + 3])
  parts[#parts + 1] = '{"id":"' .. id .. '","s":' .. ARGV[i] .. ',"n":' .. ARGV[i + 1] ..
    ',"k":"' .. ARGV[i + 2] .. '","d":' .. ARGV[i + 3] .. '}'
end
redis.call('PEXPIRE', key, ARGV[2])
redis.call('PUBLISH', key, '{"entries":[' .. table.concat(parts, ',') .. ']}')
return #parts
`)
