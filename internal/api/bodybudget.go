package api

import "sync"

// bodyBudget bounds the bytes of submit bodies that one replica reads at once, so that many
// clients sending large bodies together (or slowly, up to the read timeout) cannot make it hold
// more memory than the budget: each body counts its Content-Length, or the largest body allowed
// when it has none, from before its first byte is read until its request ends.
type bodyBudget struct {
	mu   sync.Mutex
	held int64
	max  int64
}

// take reserves n bytes; false when they would pass the budget.
func (b *bodyBudget) take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+n > b.max {
		return false
	}
	b.held += n
	return true
}

// give returns n bytes taken.
func (b *bodyBudget) give(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
}

// inFlight is how many bytes are reserved.
func (b *bodyBudget) inFlight() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}
