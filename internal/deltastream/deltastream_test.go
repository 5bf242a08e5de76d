package deltastream_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/redistest"
)

type testBundle struct {
	rdb redis.UniversalClient
	buf *deltastream.Buffer
}

func setup(t *testing.T, url string, cfg deltastream.Config) *testBundle {
	t.Helper()
	rdb := redistest.ClientOf(t, url)
	cfg.Redis, cfg.Prefix = rdb, redistest.PrefixOn(t, url)
	return &testBundle{rdb: rdb, buf: deltastream.New(cfg)}
}

type data struct {
	Attempt  int    `json:"attempt"`
	Offset   int    `json:"offset"`
	Type     string `json:"type"`
	Index    int    `json:"index"`
	ToolID   string `json:"tool_id"`
	ToolName string `json:"tool_name"`
	Text     string `json:"text"`
}

func decode(t *testing.T, e deltastream.Entry) data {
	t.Helper()
	var d data
	require.NoError(t, json.Unmarshal(e.Data, &d))
	return d
}

// TestWriter_Buffer proves that an attempt's pieces reach the job's buffer in order, numbered
// within the attempt, with their offsets; that a reset follows an attempt that streamed; and
// that the buffer is bounded and expires.
func TestWriter_Buffer(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"Redis": redistest.URL(), "Cluster": redistest.ClusterURL()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, url, deltastream.Config{TTL: time.Minute})
			w := b.buf.Writer("job1", 3, 1)
			w.Add(deltastream.Delta{Type: "text", Text: "Hello"})
			w.Add(deltastream.Delta{Type: "text", Text: ", "})
			w.Add(deltastream.Delta{Type: "input_json", Index: 1, ToolID: "t1", ToolName: "f"})
			w.Add(deltastream.Delta{Type: "input_json", Index: 1, Text: `{"a":1}`})
			w.Reset(t.Context())
			require.True(t, w.Streamed())

			entries, err := b.buf.Read(t.Context(), "job1", "", 100)
			require.NoError(t, err)
			require.GreaterOrEqual(t, len(entries), 3)
			var text, args strings.Builder
			offset := 0
			for i, e := range entries {
				require.Equal(t, 3, e.Seq)
				require.Equal(t, i+1, e.N, "numbered within the attempt")
				if i == len(entries)-1 {
					require.Equal(t, deltastream.KindReset, e.Kind)
					continue
				}
				require.Equal(t, deltastream.KindDelta, e.Kind)
				d := decode(t, e)
				require.Equal(t, offset, d.Offset)
				offset += len(d.Text)
				if d.Type == "text" {
					text.WriteString(d.Text)
				} else {
					args.WriteString(d.Text)
				}
			}
			require.Equal(t, "Hello, ", text.String())
			require.Equal(t, `{"a":1}`, args.String())

			after, err := b.buf.Read(t.Context(), "job1", entries[0].ID, 100)
			require.NoError(t, err)
			require.Equal(t, entries[1:], after, "reads resume after an entry")

			ttl, err := b.rdb.PTTL(t.Context(), b.buf.Key("job1")).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, 50*time.Second)
			require.Contains(t, b.buf.Key("job1"), "{job1}", "hash-tagged by job")
		})
	}

	t.Run("NoResetWithoutDeltas", func(t *testing.T) {
		t.Parallel()
		b := setup(t, redistest.URL(), deltastream.Config{})
		w := b.buf.Writer("job2", 2, 1)
		w.Reset(t.Context())
		require.False(t, w.Streamed())
		entries, err := b.buf.Read(t.Context(), "job2", "", 10)
		require.NoError(t, err)
		require.Empty(t, entries)
	})

	t.Run("Bounded", func(t *testing.T) {
		t.Parallel()
		b := setup(t, redistest.URL(), deltastream.Config{MaxLen: 10})
		w := b.buf.Writer("job3", 2, 1)
		for i := range 500 {
			w.Add(deltastream.Delta{Type: "text", Index: i % 2, Text: "x"}) // alternating blocks: no merging
		}
		w.Close(t.Context())
		n, err := b.rdb.XLen(t.Context(), b.buf.Key("job3")).Result()
		require.NoError(t, err)
		require.Less(t, n, int64(200), "trimmed to about MaxLen")
	})
}

// TestWriter_ManyWritersShareRoundTrips proves that the writers of one Buffer, whose pieces go
// to Redis together (one pipelined round trip per round, on Redis Cluster across slots too),
// each still get every piece into their own job's buffer, in order, numbered and with offsets,
// and that Close waits for each writer's last piece.
func TestWriter_ManyWritersShareRoundTrips(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"Redis": redistest.URL(), "Cluster": redistest.ClusterURL()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, url, deltastream.Config{TTL: time.Minute})
			const writers, pieces = 20, 50
			var wg sync.WaitGroup
			for j := range writers {
				wg.Go(func() {
					w := b.buf.Writer(fmt.Sprintf("many-%d", j), 2, 1)
					for i := range pieces {
						// Alternating blocks: no merging, so each piece is an entry.
						w.Add(deltastream.Delta{Type: "text", Index: i % 2, Text: strconv.Itoa(i) + ","})
					}
					w.Close(t.Context())
					assert.True(t, w.Streamed())
				})
			}
			wg.Wait()
			for j := range writers {
				entries, err := b.buf.Read(t.Context(), fmt.Sprintf("many-%d", j), "", 1000)
				require.NoError(t, err)
				var text strings.Builder
				offset := 0
				for i, e := range entries {
					require.Equal(t, i+1, e.N, "numbered in order")
					d := decode(t, e)
					require.Equal(t, offset, d.Offset)
					offset += len(d.Text)
					text.WriteString(d.Text)
				}
				var want strings.Builder
				for i := range pieces {
					want.WriteString(strconv.Itoa(i) + ",")
				}
				require.Equal(t, want.String(), text.String(), "writer %d: every piece, in order", j)
			}
		})
	}
}

// TestHub_Follow proves that a follower receives the entries written to its job's buffer, and
// only those: the same entries, in the same order, that a read of the buffer returns, each write
// connecting to the one before, without a read of the buffer.
func TestHub_Follow(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"Redis": redistest.URL(), "Cluster": redistest.ClusterURL()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, url, deltastream.Config{})
			hub := b.buf.NewHub()
			defer hub.Close()
			f := hub.Follow(t.Context(), "jobA")
			defer f.Stop()
			other := hub.Follow(t.Context(), "jobB")
			defer other.Stop()

			w := b.buf.Writer("jobA", 2, 1)
			var got []deltastream.Entry
			next := func() {
				t.Helper()
				awaitWake(t, f.Wake())
				var last deltastream.Entry
				if len(got) > 0 {
					last = got[len(got)-1]
				}
				entries, ok := f.Next(last)
				require.True(t, ok, "the entries received follow the last one read (%d so far)", len(got))
				got = append(got, entries...)
			}
			for i, text := range []string{"hi", " there", "!"} {
				w.Add(deltastream.Delta{Type: "text", Index: i, Text: text}) // a block each: no merging
				for len(got) < i+1 {
					next()
				}
			}
			w.Reset(t.Context())
			for len(got) < 4 {
				next()
			}
			read, err := b.buf.Read(t.Context(), "jobA", "", 100)
			require.NoError(t, err)
			require.Equal(t, read, got, "the entries published are the entries stored")
			require.Equal(t, deltastream.KindReset, got[3].Kind)
			select {
			case <-other.Wake():
				t.Fatal("woken for another job's write")
			default:
			}
		})
	}
}

// TestHub_FollowerReadsTheBufferWhenABatchIsMissing: a later attempt's entry that comes with no
// reset after the last entry read (its worker died) may not be the next one, nor may a message
// that is not a batch (a writer of an older version published a count): Next says so, and a read
// of the buffer then has everything.
func TestHub_FollowerReadsTheBufferWhenABatchIsMissing(t *testing.T) {
	t.Parallel()
	b := setup(t, redistest.URL(), deltastream.Config{})
	hub := b.buf.NewHub()
	defer hub.Close()
	w := b.buf.Writer("jobC", 2, 1)
	w.Add(deltastream.Delta{Type: "text", Text: "before"})
	w.Close(t.Context())
	read, err := b.buf.Read(t.Context(), "jobC", "", 100)
	require.NoError(t, err)
	require.Len(t, read, 1)

	f := hub.Follow(t.Context(), "jobC")
	defer f.Stop()
	w = b.buf.Writer("jobC", 4, 2)
	w.Add(deltastream.Delta{Type: "text", Text: "after"})
	awaitWake(t, f.Wake())
	_, ok := f.Next(read[0])
	require.False(t, ok, "a later attempt's entry, with no reset after the last one read")
	w.Close(t.Context())
	entries, err := b.buf.Read(t.Context(), "jobC", read[0].ID, 100)
	require.NoError(t, err)
	require.Len(t, entries, 1)

	require.NoError(t, b.rdb.Publish(t.Context(), b.buf.Key("jobC"), "1").Err())
	awaitWake(t, f.Wake())
	_, ok = f.Next(entries[0])
	require.False(t, ok, "a message that is not a batch")
}

// awaitWake waits for a wake-up, at most 30 s.
func awaitWake(t *testing.T, wake <-chan struct{}) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Fatal("no wake-up for a write to the followed job")
	}
}

// TestHub_ResubscribesAfterAReconnect: when the hub's Pub/Sub connection is cut, the hub
// connects and subscribes again by itself, and tells each follower that a batch may have been
// lost meanwhile (Next is not ok: read the buffer); the writes after that reach it as before.
func TestHub_ResubscribesAfterAReconnect(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	opts, err := redis.ParseURL(redistest.URL())
	require.NoError(t, err)
	opts.ClientName = "hub-reconnect-" + redistest.Rand()
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.Prefix(t)})
	hub := buf.NewHub()
	defer hub.Close()
	f := hub.Follow(ctx, "jobR")
	defer f.Stop()

	w := buf.Writer("jobR", 2, 1)
	defer w.Close(ctx)
	w.Add(deltastream.Delta{Type: "text", Text: "before"})
	awaitWake(t, f.Wake())
	got, ok := f.Next(deltastream.Entry{})
	require.True(t, ok)
	require.Len(t, got, 1)

	admin := redistest.Client(t)
	list, err := admin.ClientList(ctx).Result()
	require.NoError(t, err)
	killed := 0
	for line := range strings.SplitSeq(list, "\n") {
		if !strings.Contains(line, " name="+opts.ClientName+" ") || !strings.Contains(line, " sub=1 ") {
			continue
		}
		id := strings.TrimPrefix(strings.Fields(line)[0], "id=")
		n, err := admin.ClientKillByFilter(ctx, "ID", id).Result()
		require.NoError(t, err)
		killed += int(n)
	}
	require.Equal(t, 1, killed, "the hub's one Pub/Sub connection, in:\n%s", list)

	awaitWake(t, f.Wake())
	_, ok = f.Next(got[0])
	require.False(t, ok, "after the resubscription a batch may be missing: read the buffer")

	w.Add(deltastream.Delta{Type: "text", Index: 1, Text: "after"})
	awaitWake(t, f.Wake())
	entries, ok := f.Next(got[0])
	require.True(t, ok, "the subscription is live again")
	require.Len(t, entries, 1)
	require.Equal(t, "after", decode(t, entries[0]).Text)
}

// TestWriter_FailedWriteEndsClose proves that a writer whose writes fail (Redis unreachable)
// still drains: Close returns once the failed write is done, long before its own deadline, and
// the attempt counts as not streamed (so no reset follows it).
func TestWriter_FailedWriteEndsClose(t *testing.T) {
	t.Parallel()
	// A client of a port nothing listens on: every write fails at once.
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	buf := deltastream.New(deltastream.Config{Redis: rdb, WriteTimeout: 2 * time.Second})
	w := buf.Writer("job-unreachable", 2, 1)
	w.Add(deltastream.Delta{Type: "text", Text: "lost"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.Close(ctx)
	require.NoError(t, ctx.Err(), "Close waited for its deadline instead of the failed write")
	require.False(t, w.Streamed(), "nothing reached the buffer")
}

// gateHook holds the first command or pipeline sent after arm until release is closed, and says
// when it holds it (entered).
type gateHook struct {
	mu      sync.Mutex
	armed   bool
	entered chan struct{}
	release chan struct{}
}

func (h *gateHook) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.entered, h.release = true, make(chan struct{}), make(chan struct{})
}

func (h *gateHook) hold() {
	h.mu.Lock()
	armed := h.armed
	h.armed = false
	entered, release := h.entered, h.release
	h.mu.Unlock()
	if armed {
		close(entered)
		<-release
	}
}

func (h *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.hold(); return next(ctx, cmd) }
}
func (h *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.hold(); return next(ctx, cmds) }
}

// A reset made after a Close that returned at its deadline (Redis slow: the executor waits a few
// seconds at most) drops the attempt's pieces the flusher has not taken: taken after the reset,
// they were numbered after it, and a client showed the dead attempt's text after the reset,
// then the retry's after that.
func TestWriter_ResetAfterATimedOutCloseDropsWhatIsLeft(t *testing.T) {
	t.Parallel()
	url := redistest.URL()
	rdb := redistest.ClientOf(t, url)
	hook := &gateHook{}
	rdb.AddHook(hook)
	buf := deltastream.New(deltastream.Config{Redis: rdb, Prefix: redistest.PrefixOn(t, url)})
	w := buf.Writer("job", 2, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	w.Add(deltastream.Delta{Type: "text", Index: 0, Text: "a"})
	require.Eventually(t, func() bool { return rdb.XLen(ctx, buf.Key("job")).Val() == 1 }, 30*time.Second, time.Millisecond)
	hook.arm()
	w.Add(deltastream.Delta{Type: "text", Index: 1, Text: "b"}) // taken: its round trip is held
	select {
	case <-hook.entered:
	case <-ctx.Done():
		t.Fatal("the flusher did not send b")
	}
	w.Add(deltastream.Delta{Type: "text", Index: 2, Text: "c"}) // waits for the next round
	timedOut, stop := context.WithCancel(ctx)
	stop()
	w.Reset(timedOut) // its Close returns at once, as at the executor's deadline
	close(hook.release)
	w.Close(ctx) // everything left is written (or dropped) now
	require.NoError(t, ctx.Err())

	entries, err := buf.Read(ctx, "job", "", 100)
	require.NoError(t, err)
	var kinds []string
	for _, e := range entries {
		kinds = append(kinds, fmt.Sprintf("%s/%d.%d", e.Kind, e.Seq, e.N))
	}
	// In the buffer b may follow the reset (its round trip was held): readers order by seq.n.
	require.ElementsMatch(t, []string{"delta/2.1", "delta/2.2", "reset/2.3"}, kinds, "nothing of the attempt after its reset")
}

// TestRequested_AsTheProviderIsAsked: whether a job streams is read as the provider call reads
// the body (the top-level member named exactly "stream", its name unescaped, the last of two),
// also for a job stored by the last release, whose submits took a name written with an escape
// or in another case: a stored "\u0073tream": true streams at the provider, and its deltas must
// be written and followed; a stored "Stream": true after "stream": false does not.
func TestRequested_AsTheProviderIsAsked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"model":"m","stream":true}`, true},
		{`{"model":"m","\u0073tream":true}`, true},
		{`{"model":"m","s\u0074re\u0061m":true}`, true},
		{`{"model":"m","stream":false,"Stream":true}`, false},
		{`{"model":"m","Stream":true}`, false},
		{`{"model":"m","stream":true,"stream":false}`, false},
		{`{"model":"m","stream":"true"}`, false},
		{`{"messages":[{"content":"\u00e9 \"stream\":true"}]}`, false},
		{`{"messages":[{"stream":true}]}`, false},
		{`not json "stream":true`, false},
	} {
		require.Equal(t, tc.want, deltastream.Requested([]byte(tc.body)), "%s", tc.body)
	}
}

// TestRequested_EscapedTextIsNotDecoded: a body whose text has non-ASCII characters escaped, as
// Python's json.dumps writes them ("\u00e9"), and no member "stream" is answered without a
// decode: a name that decodes to "stream" escapes one of its letters (\u0073, …), which such a
// body never does. Requested runs on every delivery, lane choice and follow of a job.
func TestRequested_EscapedTextIsNotDecoded(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's
	text := strings.Repeat(`Gr\u00fc\u00dfe aus K\u00f6ln, caf\u00e9 \u6771\u4eac `, 2500)
	body := []byte(`{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"` + text + `"}]}`)
	require.Greater(t, len(body), 100_000)
	got := true
	allocs := testing.AllocsPerRun(5, func() { got = deltastream.Requested(body) })
	require.False(t, got)
	require.Zero(t, allocs, "allocations per call for a %d-byte body", len(body))
	streaming := []byte(`{"model":"m","stre\u0061m":true,"messages":[{"role":"user","content":"` + text + `"}]}`)
	require.True(t, deltastream.Requested(streaming))
}

// FuzzRequested: Requested answers as the provider call reads the body (llm's checkRequestBody:
// the top-level member "stream" of a map decode, true as a JSON bool).
func FuzzRequested(f *testing.F) {
	for _, s := range []string{`{"stream":true}`, `{"\u0073tream":true}`, `{"strea\u006D":true}`,
		`{"stream":true,"stream":null}`, `{"\u0053tream":true}`, `{"x":"\\u0073","stream":false}`,
		`{"stream": true }`, `{"stream":{"stream":true}}`, `[{"stream":true}]`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var top map[string]json.RawMessage
		var want bool
		if json.Unmarshal(body, &top) == nil {
			_ = json.Unmarshal(top["stream"], &want)
		}
		require.Equal(t, want, deltastream.Requested(body), "%s", body)
	})
}

// TestBuffer_End: a job's end shortens its buffer's life to EndedTTL (its entries still read),
// never lengthens it, and creates no buffer for a job without one. The buffer kept its whole TTL
// after the end before.
func TestBuffer_End(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"Redis": redistest.URL(), "Cluster": redistest.ClusterURL()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, url, deltastream.Config{TTL: 10 * time.Minute, EndedTTL: time.Minute})
			w := b.buf.Writer("job1", 2, 1)
			w.Add(deltastream.Delta{Type: "text", Text: "Hello"})
			w.Close(t.Context())
			key := b.buf.Key("job1")
			ttl, err := b.rdb.PTTL(t.Context(), key).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, 9*time.Minute)

			require.NoError(t, b.buf.End(t.Context(), "job1"))
			ttl, err = b.rdb.PTTL(t.Context(), key).Result()
			require.NoError(t, err)
			require.LessOrEqual(t, ttl, time.Minute)
			require.Greater(t, ttl, 0*time.Second)
			entries, err := b.buf.Read(t.Context(), "job1", "", 10)
			require.NoError(t, err)
			require.Len(t, entries, 1, "a client resuming just after the end still replays")

			// Never lengthened: a buffer about to expire is left so.
			require.NoError(t, b.rdb.PExpire(t.Context(), key, 5*time.Second).Err())
			require.NoError(t, b.buf.End(t.Context(), "job1"))
			ttl, err = b.rdb.PTTL(t.Context(), key).Result()
			require.NoError(t, err)
			require.LessOrEqual(t, ttl, 5*time.Second)

			require.NoError(t, b.buf.End(t.Context(), "job2"))
			n, err := b.rdb.Exists(t.Context(), b.buf.Key("job2")).Result()
			require.NoError(t, err)
			require.Zero(t, n)
		})
	}
}
