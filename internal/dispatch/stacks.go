package dispatch

import (
	"fmt"
	"runtime/debug"
	"sync"
)

// Stacks runs deliveries on long-lived goroutines. asynq starts a fresh goroutine for every task,
// with a small stack, and a delivery's path (the job store, the limiter's scripts, the provider
// call) is deep: the runtime grew each delivery's stack four or five times, copying it every
// time, about a seventh of a job's instructions (callgrind). A goroutine of Stacks keeps the
// stack its earlier deliveries grew (until a collection finds it mostly unused).
//
// The zero value is not usable: call NewStacks. Its methods are safe for concurrent use.
type Stacks struct {
	mu     sync.RWMutex
	closed bool
	work   chan func()
}

// NewStacks returns an empty Stacks: its goroutines start as deliveries need them, one per
// delivery running at once (asynq's Concurrency bounds them), and end with Close.
func NewStacks() *Stacks { return &Stacks{work: make(chan func())} }

// Run runs f on one of s's goroutines and returns when f has; a panic in f is raised again
// here, on the caller's goroutine, with f's stack in its value. After Close, and on a nil s,
// f runs on the caller's goroutine.
func (s *Stacks) Run(f func()) {
	if s == nil {
		f()
		return
	}
	var panicked any
	done := make(chan struct{})
	job := func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				panicked = fmt.Sprintf("%v\n\n%s", r, debug.Stack())
			}
		}()
		f()
	}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		f()
		return
	}
	select {
	case s.work <- job:
	default: // every goroutine is busy: one more
		go s.loop(job)
	}
	s.mu.RUnlock()
	<-done
	if panicked != nil {
		panic(panicked)
	}
}

// loop runs first, then whatever Run hands over, until Close.
func (s *Stacks) loop(first func()) {
	first()
	for f := range s.work {
		f()
	}
}

// Close ends s's goroutines as they finish what they run; later Runs run on their callers'
// goroutines. Call it once no delivery is expected (after the asynq server's Shutdown).
func (s *Stacks) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.work)
	}
}
