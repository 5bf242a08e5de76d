package gostack

import (
	"testing"
	"unsafe"
)

// deep stands for a delivery's deep call path: a frame of 1.5 × Room, which fits in the stack
// Grow gives (2 × Room, a frame or two used) and not in a goroutine's starting stack.
//
//go:noinline
func deep(i int) byte {
	var b [Room + Room/2]byte
	b[i] = 1
	return b[len(b)-1-i]
}

// stackMoves reports whether the calling goroutine's stack was copied elsewhere (grown) while
// it ran f: a local's address changes only then.
func stackMoves(f func()) bool {
	var local int
	before := uintptr(unsafe.Pointer(&local))
	f()
	return uintptr(unsafe.Pointer(&local)) != before
}

// onFreshGoroutine runs f on a goroutine of its own and returns its answer.
func onFreshGoroutine(f func() bool) bool {
	ch := make(chan bool, 1)
	go func() { ch <- f() }()
	return <-ch
}

// TestGrow: a goroutine that called Grow runs a deep call without its stack moving; one that did
// not has its stack copied for the same call (the check's own control: were the starting stack
// already large, the test could not tell Grow from doing nothing).
func TestGrow(t *testing.T) {
	t.Parallel()
	if !onFreshGoroutine(func() bool { return stackMoves(func() { deep(0) }) }) {
		t.Fatal("control: a fresh goroutine's stack did not move for a deep call, so this test cannot see Grow's effect")
	}
	if !onFreshGoroutine(func() bool { return stackMoves(Grow) }) {
		t.Fatal("Grow did not grow a fresh goroutine's stack")
	}
	if onFreshGoroutine(func() bool {
		Grow()
		return stackMoves(func() { deep(0) })
	}) {
		t.Fatal("after Grow, a deep call still had the stack grown")
	}
}
