package deltastream

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redistest"
)

// fakeTicks is a Buffer's clock in tests: now moves only when told, and a tick runs only when
// the test fires it.
type fakeTicks struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration // every tick scheduled
	tick  func()          // the pending tick (nil: none)
}

func newFakeTicks(b *Buffer) *fakeTicks {
	ft := &fakeTicks{now: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	b.now = func() time.Time { ft.mu.Lock(); defer ft.mu.Unlock(); return ft.now }
	b.afterFunc = func(d time.Duration, f func()) {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		ft.waits = append(ft.waits, d)
		ft.tick = f
	}
	return ft
}

func (ft *fakeTicks) advance(d time.Duration) {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.now = ft.now.Add(d)
}

// fire runs the pending tick, as time.AfterFunc would once its wait passed.
func (ft *fakeTicks) fire(t *testing.T) {
	t.Helper()
	ft.mu.Lock()
	f := ft.tick
	ft.tick = nil
	ft.mu.Unlock()
	require.NotNil(t, f, "no tick pending")
	f()
}

func (ft *fakeTicks) scheduled() int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	return len(ft.waits)
}

// texts reads job id's buffer and returns each entry's text, waiting (up to a deadline) until
// there are want entries and the flusher is idle.
func texts(t *testing.T, b *Buffer, id string, want int) []string {
	t.Helper()
	var out []string
	require.Eventually(t, func() bool {
		b.flusher.mu.Lock()
		idle := !b.flusher.running && len(b.flusher.queue) == 0
		b.flusher.mu.Unlock()
		entries, err := b.Read(t.Context(), id, "", 100)
		if err != nil {
			return false // the condition runs on Eventually's goroutine: no FailNow there
		}
		out = out[:0]
		for _, e := range entries {
			var d deltaData
			if json.Unmarshal(e.Data, &d) != nil {
				return false
			}
			out = append(out, d.Text)
		}
		return idle && len(out) >= want
	}, 30*time.Second, time.Millisecond, "buffer of %s: want %d entries with the flusher idle", id, want)
	return out
}

// TestWriter_Spacing proves that with Config.Spacing an attempt's first piece goes at once; that
// pieces added less than Spacing after the attempt's last write wait for the flusher's tick,
// scheduled Spacing ahead, and then go as one entry, every waiting writer at the same tick; that
// a piece after a quiet spell goes at once; and that Close sends what waits at once.
func TestWriter_Spacing(t *testing.T) {
	t.Parallel()
	url := redistest.URL()
	b := New(Config{Redis: redistest.ClientOf(t, url), Prefix: redistest.PrefixOn(t, url), Spacing: 50 * time.Millisecond})
	ft := newFakeTicks(b)
	w, v := b.Writer("job1", 2, 1), b.Writer("job2", 2, 1)

	w.Add(Delta{Type: "text", Text: "a"})
	require.Equal(t, []string{"a"}, texts(t, b, "job1", 1), "the first piece goes at once")
	v.Add(Delta{Type: "text", Text: "x"})
	require.Equal(t, []string{"x"}, texts(t, b, "job2", 1), "so does another attempt's")
	require.Zero(t, ft.scheduled())

	ft.advance(10 * time.Millisecond)
	w.Add(Delta{Type: "text", Text: "b"})
	w.Add(Delta{Type: "text", Text: "c"})
	v.Add(Delta{Type: "text", Text: "y"})
	require.Equal(t, []time.Duration{50 * time.Millisecond}, ft.waits, "one tick for every waiting writer")
	require.Equal(t, []string{"a"}, texts(t, b, "job1", 1), "nothing more before the tick")
	require.Equal(t, []string{"x"}, texts(t, b, "job2", 1))

	ft.advance(50 * time.Millisecond)
	ft.fire(t)
	require.Equal(t, []string{"a", "bc"}, texts(t, b, "job1", 2), "what waited goes as one entry")
	require.Equal(t, []string{"x", "y"}, texts(t, b, "job2", 2), "at the same tick")

	ft.advance(time.Second)
	w.Add(Delta{Type: "text", Text: "d"})
	require.Equal(t, []string{"a", "bc", "d"}, texts(t, b, "job1", 3), "after a quiet spell, at once")
	require.Equal(t, 1, ft.scheduled())

	w.Add(Delta{Type: "text", Text: "e"})
	require.Equal(t, 2, ft.scheduled(), "a piece right after a write waits")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	w.Close(ctx)
	require.NoError(t, ctx.Err(), "Close waited for its deadline")
	entries, err := b.Read(t.Context(), "job1", "", 100)
	require.NoError(t, err)
	require.Len(t, entries, 4, "Close returned with the waiting piece in Redis")
	var last deltaData
	require.NoError(t, json.Unmarshal(entries[3].Data, &last))
	require.Equal(t, deltaData{Attempt: 1, Offset: 4, Type: "text", Text: "e"}, last)

	ft.fire(t) // the tick finds nobody waiting: nothing happens
	require.Equal(t, []string{"x", "y"}, texts(t, b, "job2", 2))
	v.Close(ctx)
	require.NoError(t, ctx.Err())
}
