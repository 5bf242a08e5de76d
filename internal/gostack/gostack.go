// Package gostack gives a fresh goroutine its stack in one step.
//
// A goroutine starts with a small stack (Go's adaptive starting size, a few kilobytes) and grows it
// by doubling whenever a call would overflow it; each growth copies the whole stack and adjusts
// every frame on it. A job's delivery runs deep call paths (the HTTP client, pgx, encoding/json) on
// goroutines that live for one job, so it paid about six growths per job, each made when the stack
// was deep and dear to copy: a sixth of the instructions `llmq serve` ran for its jobs (callgrind).
// Grow, called first thing on such a goroutine, takes the room at once, while the stack holds a
// frame or two and is cheap to copy. CockroachDB's util/growstack does the same for its request
// goroutines.
package gostack

// Room is the frame Grow takes. A goroutine that has called Grow has a stack of at least 2 ×
// Room (stacks double until the frame fits above what is in use): 16 KB, deep enough for a
// delivery's paths, and the largest size the runtime serves from its per-processor stack
// caches (a larger stack is allocated from the heap, under its lock, for every goroutine).
const Room = 8 << 10

// Grow makes the calling goroutine's stack at least 2 × Room bytes, copying it now if it is
// smaller. When the stack is that large already, it costs the clearing of Room bytes. The
// stack is the runtime's as any other: shrunk by the collector when mostly unused, freed with
// the goroutine.
func Grow() { grow(0, Room-1) }

// grow's frame holds a Room-byte array. It is not inlined, and i and j are not constants
// inside it, so the compiler can neither drop the array nor shrink the frame.
//
//go:noinline
func grow(i, j int) byte {
	var b [Room]byte
	b[i] = 1
	return b[j]
}
