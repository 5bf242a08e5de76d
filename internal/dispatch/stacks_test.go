package dispatch_test

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
)

// goroutineID is the running goroutine's number, from its stack trace's first line.
func goroutineID(t *testing.T) int {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	f := strings.Fields(string(buf))
	require.Equal(t, "goroutine", f[0])
	id, err := strconv.Atoi(f[1])
	require.NoError(t, err)
	return id
}

// TestStacks_RunsOnLongLivedGoroutines: a Run's function runs on one of the Stacks' goroutines,
// not the caller's, and the next Run reuses it; Runs at once each get a goroutine (none waits
// for another); a panic comes back to the caller; after Close functions run on the caller's
// goroutine and the Stacks' goroutines end.
func TestStacks_RunsOnLongLivedGoroutines(t *testing.T) {
	t.Parallel()
	s := dispatch.NewStacks()
	caller := goroutineID(t)
	var first, second int
	s.Run(func() { first = goroutineID(t) })
	s.Run(func() { second = goroutineID(t) })
	require.NotEqual(t, caller, first)
	require.Equal(t, first, second, "the second Run reused the first one's goroutine")

	// 20 at once: each waits for all the others to have started.
	const n = 20
	var started sync.WaitGroup
	started.Add(n)
	all := make(chan struct{})
	go func() { started.Wait(); close(all) }()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			s.Run(func() {
				started.Done()
				select {
				case <-all:
				case <-time.After(10 * time.Second):
					t.Error("a Run waited for another to finish")
				}
			})
		})
	}
	wg.Wait()

	// A panic in the function is raised again on the caller's goroutine, with where it began.
	var got any
	func() {
		defer func() { got = recover() }()
		s.Run(func() { panic("boom") })
	}()
	require.Contains(t, got, "boom")
	require.Contains(t, got, "stacks_test.go", "the panicking function's stack")
	var after int
	s.Run(func() { after = goroutineID(t) })
	require.NotEqual(t, caller, after, "the Stacks still run functions after a panic")

	s.Close()
	var closed int
	s.Run(func() { closed = goroutineID(t) })
	require.Equal(t, caller, closed, "after Close, on the caller's goroutine")
	require.Eventually(t, func() bool {
		buf := make([]byte, 1<<20)
		return !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("dispatch.(*Stacks).loop"))
	}, 10*time.Second, 10*time.Millisecond, "the Stacks' goroutines end after Close")
	s.Close() // twice is harmless
}

// TestStacks_Nil: a nil Stacks runs the function on the caller's goroutine.
func TestStacks_Nil(t *testing.T) {
	t.Parallel()
	var s *dispatch.Stacks
	caller, ran := goroutineID(t), 0
	s.Run(func() { ran = goroutineID(t) })
	require.Equal(t, caller, ran)
}
