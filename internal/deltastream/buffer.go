package deltastream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/streamname"
)

// Entry kinds.
const (
	// KindDelta is a piece of an attempt's output.
	KindDelta = "delta"
	// KindReset says the attempt's output is void: a retry starts over.
	KindReset = "reset"
)

// Config configures a Buffer.
type Config struct {
	// Redis holds the buffers. Required.
	Redis redis.UniversalClient
	// Prefix starts every key and channel. Default "llmq:".
	Prefix string
	// MaxLen bounds each job's buffer, in entries (trimmed approximately, XADD MAXLEN ~).
	// Default 10000: with merged pieces, far more than one long answer. The programs set it
	// from streaming.buffer_max_entries.
	MaxLen int64
	// TTL is how long a buffer outlives its last write. Default 10m. The programs set it from
	// streaming.buffer_ttl.
	TTL time.Duration
	// EndedTTL is how long a buffer outlives its job's end (End), when less than what its TTL
	// leaves: long enough for a client cut just before the end to reconnect and replay the
	// attempt's deltas (Last-Event-ID seq.n); a stream opened later starts at the terminal event,
	// which carries the whole result, and sends no delta. Default a minute.
	EndedTTL time.Duration
	// WriteTimeout bounds one write round trip. Default 5s.
	WriteTimeout time.Duration
	// Spacing spaces the writes of an attempt's pieces: a piece added less than Spacing after
	// the attempt's last write waits for the Buffer's next flush tick (at most Spacing away),
	// and the pieces added meanwhile go with it, merged (one entry, one event per client, where
	// a provider's every token would be one); the waiting writers of every attempt go together,
	// in one round trip per tick. An attempt's first piece, and a piece after a quiet spell of
	// Spacing, go at once; Close sends what waits at once. 0 (the default): each piece goes as
	// soon as the flusher takes it. The worker sets it from streaming.delta_spacing.
	Spacing time.Duration
	// Logger receives write failures (deltas are best effort: the result is stored whole in
	// Postgres). Default discards.
	Logger *slog.Logger
}

// Buffer reads and writes jobs' delta buffers. Safe for concurrent use.
type Buffer struct {
	cfg     Config
	flusher *flusher // writes every Writer's pieces
	// maxLenArg and ttlArg are cfg.MaxLen and cfg.TTL in milliseconds, boxed once as writeScript
	// takes them (read only).
	maxLenArg, ttlArg any
	// now and afterFunc are the clock that Spacing is kept by (time.Now, time.AfterFunc; tests
	// replace them): afterFunc runs f after d.
	now       func() time.Time
	afterFunc func(d time.Duration, f func())
}

// New returns a Buffer. It panics without Redis (a wiring bug).
func New(cfg Config) *Buffer {
	if cfg.Redis == nil {
		panic("deltastream.New: Redis is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "llmq:"
	}
	if cfg.MaxLen == 0 {
		cfg.MaxLen = 10000
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Minute
	}
	if cfg.EndedTTL == 0 {
		cfg.EndedTTL = time.Minute
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b := &Buffer{cfg: cfg, maxLenArg: cfg.MaxLen, ttlArg: cfg.TTL.Milliseconds(), now: time.Now,
		afterFunc: func(d time.Duration, f func()) { time.AfterFunc(d, f) }}
	b.flusher = &flusher{b: b}
	return b
}

// Key returns the Redis key of job id's buffer; it is also the name of its pub/sub channel.
func (b *Buffer) Key(id string) string { return b.cfg.Prefix + "{" + id + "}:deltas" }

// Requested reports whether a provider-native request body asks for a stream ("stream": true),
// as the provider call reads it (llm's Send): the top-level member named exactly "stream", the
// last one when sent twice, its name unescaped. A submit refuses that name escaped or in another
// case, but a job stored by an earlier release may have it so ("\u0073tream", "Stream") and is
// delivered by this one: whether it streams is what the provider is asked, so that its deltas
// are written and followed exactly when the provider streams them.
func Requested(body []byte) bool {
	// Most bodies cannot name "stream", those with non-ASCII text escaped (\u00e9) too.
	if !streamname.Possible(body) {
		return false
	}
	var top map[string]isTrue // its values are read in place, not copied
	if json.Unmarshal(body, &top) != nil {
		return false
	}
	return bool(top["stream"])
}

// isTrue is whether a JSON value is true, as decoding it into a bool says.
type isTrue bool

// UnmarshalJSON implements json.Unmarshaler.
func (v *isTrue) UnmarshalJSON(b []byte) error {
	*v = string(bytes.TrimSpace(b)) == "true"
	return nil
}

// Entry is one entry of a job's buffer.
type Entry struct {
	// ID is the Redis stream entry ID: Read's cursor.
	ID string
	// Seq is the job's event sequence number of the attempt's running event; N numbers the
	// attempt's entries from 1.
	Seq, N int
	// Kind is KindDelta or KindReset.
	Kind string
	// Data is the entry's JSON (see the package comment).
	Data json.RawMessage
	// Attempt is the attempt number in Data, read once for every follower of the entry.
	Attempt int
}

// attemptOf reads the "attempt" of an entry's JSON: at once when it comes first, as the writers
// put it, else by decoding (0: none).
func attemptOf(data []byte) int {
	p := batchScanner{rest: data}
	var n int
	if p.lit(`{"attempt":`) && p.int(&n) && len(p.rest) > 0 && (p.rest[0] == ',' || p.rest[0] == '}') {
		return n
	}
	var d struct {
		Attempt int `json:"attempt"`
	}
	_ = json.Unmarshal(data, &d)
	return d.Attempt
}

// End shortens job id's buffer's life to Config.EndedTTL once the job ended (the buffer's TTL is
// left when it ends sooner; a job without a buffer is left without one). Nothing needs the
// buffer long after the end: the terminal event carries the whole result, and only a client
// that resumes inside the last attempt replays its deltas. Each ended job's buffer was kept for
// its whole TTL (10 minutes by default). A later write (the job retried by an operator) sets the
// TTL again.
func (b *Buffer) End(ctx context.Context, id string) error {
	if err := endScript.Run(ctx, b.cfg.Redis, []any{b.Key(id)}, b.cfg.EndedTTL.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("end delta buffer of job %s: %w", id, err)
	}
	return nil
}

// endScript shortens a key's TTL to ARGV[1] ms when it has a longer one, and leaves a key without
// one or a missing key alone (PEXPIRE's LT option, which needs Redis 7; this runs on Redis 6).
var endScript = redisscript.NewScript(`
local ttl = redis.call('PTTL', KEYS[1])
if ttl > tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 0
`)

// Read returns up to count entries of job id's buffer after the entry ID after ("" reads from
// the start), in order.
func (b *Buffer) Read(ctx context.Context, id, after string, count int64) ([]Entry, error) {
	start := "-"
	if after != "" {
		start = "(" + after
	}
	msgs, err := b.cfg.Redis.XRangeN(ctx, b.Key(id), start, "+", count).Result()
	if err != nil {
		return nil, fmt.Errorf("read deltas of job %s: %w", id, err)
	}
	out := make([]Entry, 0, len(msgs))
	for _, m := range msgs {
		e := Entry{ID: m.ID}
		e.Seq, _ = strconv.Atoi(fmt.Sprint(m.Values["s"]))
		e.N, _ = strconv.Atoi(fmt.Sprint(m.Values["n"]))
		e.Kind, _ = m.Values["k"].(string)
		d, _ := m.Values["d"].(string)
		e.Data = json.RawMessage(d)
		if e.Seq <= 0 || e.N <= 0 || !json.Valid(e.Data) {
			continue // not ours: skip it rather than fail the stream
		}
		e.Attempt = attemptOf(e.Data)
		out = append(out, e)
	}
	return out, nil
}
