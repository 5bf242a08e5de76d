package deltastream

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
)

// Delta is one piece of an attempt's output, as the provider adapter reads it.
type Delta struct {
	// Type is the piece's kind: "text", "input_json", "thinking", "refusal".
	Type string
	// Index is the content block (Anthropic) or choice (OpenAI).
	Index int
	// ToolIndex is the OpenAI tool call's place in the choice's stored tool_calls
	// (llm.Delta.ToolIndex).
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
	keys    []any // writeScript's KEYS for the job's buffer
	seq     int
	attempt int

	mu      sync.Mutex
	pending []deltaData
	offset  int  // bytes of text added so far
	n       int  // entries numbered so far
	queued  bool // in the Buffer's flusher's queue, or waiting for its tick (flusher.wait)
	// sentAt is when the flusher last took pieces of the writer (zero: never, or no Spacing).
	sentAt  time.Time
	writing bool // a batch of it is in the flusher's round trip
	closed  bool
	drained chan struct{} // made by Close; closed once nothing is pending or being written
	written int           // entries written to Redis
	// failed is how many of its writes failed: only the first is logged, since with Redis
	// away every piece's write fails, at once.
	failed int
}

// Writer starts the writer of an attempt of job id: seq is the job's event sequence number of
// the attempt's running event, attempt its number. Call Close when the attempt's call returns.
func (b *Buffer) Writer(id string, seq, attempt int) *Writer {
	return &Writer{b: b, job: id, keys: b.keys(id), seq: seq, attempt: attempt}
}

// Add queues d; it never blocks on Redis. Consecutive pieces of one block are merged.
func (w *Writer) Add(d Delta) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.offset += len(d.Text)
	if k := len(w.pending) - 1; k >= 0 && d.ToolID == "" && d.ToolName == "" {
		p := &w.pending[k]
		if p.Type == d.Type && p.Index == d.Index && p.ToolIndex == d.ToolIndex && len(p.Text)+len(d.Text) <= maxMerged {
			p.Text += d.Text
			w.mu.Unlock()
			return // queued already, with the piece it joins
		}
	}
	w.pending = append(w.pending, deltaData{Attempt: w.attempt, Offset: w.offset - len(d.Text), Type: d.Type, Index: d.Index,
		ToolIndex: d.ToolIndex, ToolID: d.ToolID, ToolName: d.ToolName, Text: d.Text})
	enqueue := !w.queued
	w.queued = true
	if enqueue && w.b.cfg.Spacing > 0 && !w.sentAt.IsZero() && w.b.now().Sub(w.sentAt) < w.b.cfg.Spacing {
		// Written less than Spacing ago: these wait for the flusher's next tick.
		w.b.flusher.wait(w)
		enqueue = false
	}
	w.mu.Unlock()
	if enqueue {
		w.b.flusher.add(w)
	}
}

// take hands the flusher the writer's pending pieces as entries (nil: none), marking them being
// written.
func (w *Writer) take() []entryValues {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.queued = false
	batch := w.pending
	w.pending = nil
	if len(batch) == 0 {
		return nil
	}
	if w.b.cfg.Spacing > 0 {
		w.sentAt = w.b.now()
	}
	first := w.n + 1
	w.n += len(batch)
	w.writing = true
	values := make([]entryValues, len(batch))
	for i, d := range batch {
		data, _ := json.Marshal(d) // plain fields: cannot fail
		values[i] = entryValues{seq: w.seq, n: first + i, kind: KindDelta, data: data}
	}
	return values
}

// wrote records the outcome of the flusher's write of n entries taken from the writer. The
// attempt's first failed write is logged, not the others.
func (w *Writer) wrote(n int, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		w.written += n
	} else if w.failed++; w.failed == 1 {
		// Before the write is marked done: a Close that returns finds it logged.
		w.b.cfg.Logger.Warn("write stream deltas (the attempt's further failed writes are not logged)",
			"job_id", w.job, "attempt", w.attempt, "error", err)
	}
	w.writing = false
	w.checkDrained()
}

// checkDrained closes drained once Close was called and nothing is pending or being written.
// Call with mu held.
func (w *Writer) checkDrained() {
	if w.drained != nil && !w.queued && !w.writing && len(w.pending) == 0 {
		select {
		case <-w.drained:
		default:
			close(w.drained)
		}
	}
}

// Close stops the writer; it returns once everything added is in Redis (or its write failed),
// or when ctx ends. Safe to call more than once.
func (w *Writer) Close(ctx context.Context) {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		w.drained = make(chan struct{})
		if w.queued {
			w.b.flusher.promote(w) // pieces waiting for the tick go now
		}
		w.checkDrained()
	}
	drained := w.drained
	w.mu.Unlock()
	select {
	case <-drained:
	case <-ctx.Done():
	}
}

// Streamed reports whether any entry of the attempt reached the buffer. Call after Close.
func (w *Writer) Streamed() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written > 0
}

// Reset closes the writer and, when the attempt streamed, appends a reset entry: the clients
// drop what they showed, a retry starts over. Call it before the retry is recorded, so that the
// reset precedes the job's next status event.
func (w *Writer) Reset(ctx context.Context) {
	w.Close(ctx)
	w.mu.Lock()
	// Close may have returned at ctx's end with pieces the flusher has not taken yet: the
	// attempt is void, and none of them may be numbered after its reset.
	w.pending = nil
	streamed := w.written > 0
	w.n++
	n := w.n
	w.mu.Unlock()
	if !streamed {
		return
	}
	data, _ := json.Marshal(struct {
		Attempt int `json:"attempt"`
	}{w.attempt})
	if err := w.b.write(w.keys, []entryValues{{seq: w.seq, n: n, kind: KindReset, data: data}}); err != nil {
		w.b.cfg.Logger.Warn("write stream reset", "job_id", w.job, "attempt", w.attempt, "error", err)
	}
}

// write appends entries to the buffer whose KEYS are keys (Buffer.keys), trims it, sets its TTL
// and publishes the entries, in one round trip (writeScript).
func (b *Buffer) write(keys []any, values []entryValues) error {
	ctx, cancel := context.WithTimeout(context.Background(), b.cfg.WriteTimeout)
	defer cancel()
	return redisscript.Run(ctx, b.cfg.Redis, b.writeCall(keys, values, nil))
}

// keys are the KEYS of writeScript for job id's buffer, boxed once for its writer's calls.
func (b *Buffer) keys(id string) []any { return []any{b.Key(id)} }

// writeCall is write's script call; done, when set, receives its outcome. Only the numbers that
// change per entry are formatted (into one buffer); the data is sent from values' own bytes, so
// values must not change until the call is done.
func (b *Buffer) writeCall(keys []any, values []entryValues, done func(error)) redisscript.Call {
	args := make([]any, 0, 2+5*len(values))
	args = append(args, b.maxLenArg, b.ttlArg)
	var a redisscript.Args
	for i := range values {
		v := &values[i]
		args = append(args, a.Int(int64(v.seq)), a.Int(int64(v.n)), kindArg(v.kind), a.Int(int64(len(v.data))),
			redisscript.Bytes(&v.data))
	}
	c := redisscript.Call{Script: writeScript, Keys: keys, Args: args}
	if done != nil {
		c.Done = func(_ context.Context, cmd *redis.Cmd) error {
			done(cmd.Err())
			return cmd.Err()
		}
	}
	return c
}

// kindArg is kind as an argument: the kinds' constants boxed allocate nothing, a string variable
// boxed does.
func kindArg(kind string) any {
	switch kind {
	case KindDelta:
		return KindDelta
	case KindReset:
		return KindReset
	}
	return kind
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
// KEYS[1] the buffer (its name is also the channel's). ARGV[1] MaxLen, ARGV[2] TTL ms, then five
// per entry: seq, n, kind, the data's length in bytes, data (JSON). The message is a batch's JSON
// (see hub.go): the entries with the IDs the buffer gave them, each with its data's length ("dl",
// see parseBatch). The pieces are the writer's own (numbers, a kind, JSON it encoded), so they
// are concatenated as they are.
var writeScript = redisscript.NewScript(`
local key = KEYS[1]
local parts = {}
for i = 3, #ARGV, 5 do
  local id = redis.call('XADD', key, 'MAXLEN', '~', ARGV[1], '*', 's', ARGV[i], 'n', ARGV[i + 1],
    'k', ARGV[i + 2], 'd', ARGV[i + 4])
  parts[#parts + 1] = '{"id":"' .. id .. '","s":' .. ARGV[i] .. ',"n":' .. ARGV[i + 1] ..
    ',"k":"' .. ARGV[i + 2] .. '","dl":' .. ARGV[i + 3] .. ',"d":' .. ARGV[i + 4] .. '}'
end
redis.call('PEXPIRE', key, ARGV[2])
redis.call('PUBLISH', key, '{"entries":[' .. table.concat(parts, ',') .. ']}')
return #parts
`)

// flusher writes the pending pieces of every Writer of a Buffer: each round takes what all the
// writers with pieces hold and sends their scripts in one pipelined round trip
// (redisscript.Run), one round at a time, so that a writer's batches reach Redis in order. A
// piece added while a round is out goes in the next: under load, many streams' tokens share a
// round trip, where one goroutine and one round trip per writer cost a wake-up and a round trip
// per token. There is no background goroutine while nothing is pending: the Add that finds the
// flusher idle starts one, which runs until the queue is empty (as the job store's batcher).
//
// With Config.Spacing, a writer written to less than Spacing ago waits instead (wait), and
// every waiting writer joins the queue at the next tick, one Spacing after the first of them
// began to wait: one round for them all, where a timer per writer would cost a round each.
type flusher struct {
	b *Buffer

	mu      sync.Mutex
	queue   []*Writer
	running bool
	waiting []*Writer // for the tick
	ticking bool      // a tick is scheduled
}

// wait makes w (which has pieces pending and is not queued) wait for the next tick, scheduling
// it if none is. Call with w.mu held.
func (f *flusher) wait(w *Writer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.waiting = append(f.waiting, w)
	if !f.ticking {
		f.ticking = true
		f.b.afterFunc(f.b.cfg.Spacing, f.tick)
	}
}

// tick queues every waiting writer and runs the rounds.
func (f *flusher) tick() {
	f.mu.Lock()
	f.ticking = false
	f.queue = append(f.queue, f.waiting...)
	clear(f.waiting)
	f.waiting = f.waiting[:0]
	start := !f.running && len(f.queue) > 0
	f.running = f.running || start
	f.mu.Unlock()
	if start {
		f.run()
	}
}

// promote queues w now if it waits for the tick (Close: the attempt's last pieces do not wait).
// Call with w.mu held.
func (f *flusher) promote(w *Writer) {
	f.mu.Lock()
	i := slices.Index(f.waiting, w)
	if i >= 0 {
		f.waiting = slices.Delete(f.waiting, i, i+1)
	}
	f.mu.Unlock()
	if i >= 0 {
		f.add(w)
	} // else queued already
}

// add queues w (which has pieces pending and was not queued) and starts a round if none runs.
func (f *flusher) add(w *Writer) {
	f.mu.Lock()
	f.queue = append(f.queue, w)
	start := !f.running
	f.running = true
	f.mu.Unlock()
	if start {
		go f.run()
	}
}

// maxRound bounds the writers of one round.
const maxRound = 256

// run sends rounds until the queue is empty.
func (f *flusher) run() {
	for {
		f.mu.Lock()
		if len(f.queue) == 0 {
			f.running = false
			f.mu.Unlock()
			return
		}
		n := min(len(f.queue), maxRound)
		round := append([]*Writer(nil), f.queue[:n]...)
		f.queue = append(f.queue[:0], f.queue[n:]...)
		f.mu.Unlock()
		f.send(round)
	}
}

// send writes the round's writers' pieces in one round trip.
func (f *flusher) send(round []*Writer) {
	calls := make([]redisscript.Call, 0, len(round))
	for _, w := range round {
		values := w.take()
		if values == nil {
			w.wrote(0, nil)
			continue
		}
		calls = append(calls, f.b.writeCall(w.keys, values, func(err error) { w.wrote(len(values), err) }))
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.b.cfg.WriteTimeout)
	defer cancel()
	_ = redisscript.Run(ctx, f.b.cfg.Redis, calls...) // each call's outcome went to its writer
}
