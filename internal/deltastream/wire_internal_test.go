package deltastream

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redistest"
)

// TestBuffer_WireArgs pins the exact arguments of a write of entries: the processes of the last
// release run the same script on the same buffers, so however the arguments are built (boxed one
// by one, or sent from the entries' own bytes) they must reach Redis byte for byte as before.
func TestBuffer_WireArgs(t *testing.T) {
	t.Parallel()
	w := redistest.NewWire(t)
	prefix := redistest.Prefix(t)
	b := New(Config{Redis: w.Client, Prefix: prefix, MaxLen: 5000, TTL: 90_000_000_000})
	got := w.CachedEvalSHAs(t, strings.NewReplacer(prefix, "P:"), func() {
		require.NoError(t, b.write(b.keys("job-1"), []entryValues{
			{seq: 7, n: 1, kind: KindDelta, data: []byte(`{"text":"a"}`)},
			{seq: 7, n: 300, kind: KindDelta, data: []byte(`{"text":"` + strings.Repeat("é", 80) + `"}`)},
		}))
		require.NoError(t, b.write(b.keys("job-2"), []entryValues{{seq: 1024, n: 70000, kind: KindReset, data: []byte(`{}`)}}))
	})
	require.Equal(t, []string{
		`evalsha | 0eb40946cd12c543509f9dbc5e6f20bf188957f5 | 1 | P:{job-1}:deltas | 5000 | 90000 | 7 | 1 | delta | 12 | {"text":"a"} | 7 | 300 | delta | 171 | {"text":"` + strings.Repeat("é", 80) + `"}`,
		`evalsha | 0eb40946cd12c543509f9dbc5e6f20bf188957f5 | 1 | P:{job-2}:deltas | 5000 | 90000 | 1024 | 70000 | reset | 2 | {}`,
	}, got)
}

// TestBuffer_WriteAllocs pins the allocations of a write of a streaming attempt's entries: with
// the key built and boxed, the MaxLen and TTL boxed, and each entry's number, kind, length and
// data boxed at every call, this write of three entries took 25. The bound is the count with the
// key boxed once per writer, MaxLen and TTL once per Buffer, the numbers formatted into one buffer
// (redisscript.Args) and the data sent from the entries' own bytes (redisscript.Bytes): the rest
// is the write's deadline, the call's slices and go-redis's.
func TestBuffer_WriteAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops go-redis's pooled buffers at random")
	}
	b := New(Config{Redis: redistest.Client(t), Prefix: redistest.Prefix(t)})
	values := []entryValues{
		{seq: 7, n: 1000, kind: KindDelta, data: []byte(`{"attempt":1,"offset":0,"type":"text","index":0,"text":"Hello"}`)},
		{seq: 7, n: 1001, kind: KindDelta, data: []byte(`{"attempt":1,"offset":5,"type":"text","index":0,"text":" world"}`)},
		{seq: 7, n: 1002, kind: KindReset, data: []byte(`{"attempt":1}`)},
	}
	keys := b.keys("job-allocs")              // boxed once per writer
	require.NoError(t, b.write(keys, values)) // the connection, and the script cached
	allocs := testing.AllocsPerRun(200, func() {
		if err := b.write(keys, values); err != nil {
			panic(err)
		}
	})
	t.Logf("write: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 12.0, "allocations per write")
}
