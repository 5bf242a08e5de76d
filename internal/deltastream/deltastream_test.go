package deltastream_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// TestHub_Follow proves that a follower is woken when its job's buffer grows, and only then.
func TestHub_Follow(t *testing.T) {
	t.Parallel()
	for name, url := range map[string]string{"Redis": redistest.URL(), "Cluster": redistest.ClusterURL()} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, url, deltastream.Config{})
			hub := b.buf.NewHub()
			defer hub.Close()
			wake, stop := hub.Follow(t.Context(), "jobA")
			defer stop()
			other, stopOther := hub.Follow(t.Context(), "jobB")
			defer stopOther()

			w := b.buf.Writer("jobA", 2, 1)
			w.Add(deltastream.Delta{Type: "text", Text: "hi"})
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			select {
			case <-wake:
			case <-ctx.Done():
				t.Fatal("no wake-up for a write to the followed job")
			}
			w.Close(t.Context())
			select {
			case <-other:
				t.Fatal("woken for another job's write")
			default:
			}
		})
	}
}
