package metricseries_test

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/metricseries"
)

// series stands for a Prometheus series: a pointer, so that the test sees which one a Get
// returned, not only its value.
type series struct{ key string }

// TestMap_ConcurrentFirstUseMakesEachOnce: goroutines let go at once on keys never asked for
// make each key's series once, and all get that one (run under -race).
func TestMap_ConcurrentFirstUseMakesEachOnce(t *testing.T) {
	t.Parallel()
	var m metricseries.Map[string, *series]
	keys := []string{"main", "backup", "batch"}
	var made [3]atomic.Int32
	mk := func(key string) *series {
		runtime.Gosched() // let the other goroutines reach the key while it is being made
		for i, k := range keys {
			if k == key {
				made[i].Add(1)
			}
		}
		return &series{key: key}
	}
	const n = 16
	got := make([][3]*series, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			<-start
			for i := range keys {
				j := (g + i) % len(keys) // goroutines meet each key first in different orders
				got[g][j] = m.Get(keys[j], mk)
			}
		})
	}
	close(start)
	waitWithin(t, &wg, 30*time.Second)
	for i, k := range keys {
		require.Equal(t, int32(1), made[i].Load(), "%s made", k)
		first, ok := m.Load(k)
		require.True(t, ok, k)
		require.Equal(t, k, first.key)
		for g := range n {
			require.Same(t, first, got[g][i], "goroutine %d's %s", g, k)
		}
	}
	require.Same(t, got[0][0], m.Get("main", func(string) *series { panic("made again") }))
}

// TestLazy_ConcurrentFirstUseMakesItOnce: goroutines let go at once on a series never asked for
// make it once, and all get that one (run under -race).
func TestLazy_ConcurrentFirstUseMakesItOnce(t *testing.T) {
	t.Parallel()
	var l metricseries.Lazy[*series]
	var made atomic.Int32
	mk := func() *series {
		runtime.Gosched() // let the other goroutines reach the series while it is being made
		made.Add(1)
		return &series{key: "stage"}
	}
	const n = 16
	got := make([]*series, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			<-start
			got[g] = l.Get(mk)
		})
	}
	close(start)
	waitWithin(t, &wg, 30*time.Second)
	require.Equal(t, int32(1), made.Load())
	for g := range n {
		require.Same(t, got[0], got[g], "goroutine %d", g)
	}
	require.Same(t, got[0], l.Get(func() *series { panic("made again") }))
}

// TestMap_LoadMakesNothing: Load finds only what a Get made, and makes nothing.
func TestMap_LoadMakesNothing(t *testing.T) {
	t.Parallel()
	var m metricseries.Map[int, *series]
	_, ok := m.Load(200)
	require.False(t, ok, "empty")
	made := m.Get(200, func(int) *series { return &series{key: "200"} })
	_, ok = m.Load(503)
	require.False(t, ok, "a key never got")
	s, ok := m.Load(200)
	require.True(t, ok)
	require.Same(t, made, s)
}

// TestMapAndLazy_HitsAllocateNothing: once made, a series is read without allocating (the
// per-job lookups they replace allocated).
func TestMapAndLazy_HitsAllocateNothing(t *testing.T) { // not parallel: AllocsPerRun counts every goroutine's allocations
	var m metricseries.Map[string, *series]
	var l metricseries.Lazy[*series]
	mk := func(key string) *series { return &series{key: key} }
	mkLazy := func() *series { return &series{key: "stage"} }
	for _, k := range []string{"a", "b", "c"} {
		m.Get(k, mk)
	}
	l.Get(mkLazy)
	allocs := testing.AllocsPerRun(100, func() {
		m.Get("b", mk)
		m.Load("c")
		l.Get(mkLazy)
	})
	require.Zero(t, allocs)
}

// waitWithin waits for wg, failing the test if it has not finished within d.
func waitWithin(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("goroutines still running after %v", d)
	}
}
