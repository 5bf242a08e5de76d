package api

import "sync"

// bodyBudget bounds the bytes of submit bodies that one replica reads at once, so that many
// clients sending large bodies together (or slowly, up to the read timeout) cannot make it hold
// more memory than the budget: each body counts its Content-Length, or the largest body allowed
// when it has none, from before its first byte is read until its request ends.
//
// Polls use one of their own for the job results they answer (Server.answerBytes): each counts
// its result's bytes from its read until its answer is written, so that clients that do not
// read cannot make the replica hold more.
//
// One tenant (the anonymous clients are one) holds at most share of it, so that one tenant's
// slow large bodies cannot make every other tenant's submit wait for them.
type bodyBudget struct {
	mu    sync.Mutex
	held  int64
	max   int64
	share int64
	// tenants are the bytes each tenant holds, by name; a tenant holding none has no entry.
	tenants map[string]int64
}

// newBodyBudget returns a budget of total bytes of which one tenant may hold half, or maxBody
// (one largest body) when that is more.
func newBodyBudget(total, maxBody int64) *bodyBudget {
	return &bodyBudget{max: total, share: min(total, max(total/2, maxBody)), tenants: map[string]int64{}}
}

// bodyRefusal is why take refused a body: none (taken), the tenant's share, or the budget.
type bodyRefusal int

const (
	bodyTaken bodyRefusal = iota
	// bodyOverShare: the tenant holds its share already (its own doing: a 429).
	bodyOverShare
	// bodyOverBudget: the replica holds its whole budget (every tenant's: a 503).
	bodyOverBudget
)

// take reserves n bytes for tenant, or says which bound they would pass (the tenant's share
// before the budget).
func (b *bodyBudget) take(tenant string, n int64) bodyRefusal {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tenants[tenant]+n > b.share {
		return bodyOverShare
	}
	if b.held+n > b.max {
		return bodyOverBudget
	}
	b.held += n
	b.tenants[tenant] += n
	return bodyTaken
}

// give returns n bytes tenant took; none (0) takes no turn at the lock.
func (b *bodyBudget) give(tenant string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
	if b.tenants[tenant] -= n; b.tenants[tenant] <= 0 {
		delete(b.tenants, tenant)
	}
}

// inFlight is how many bytes are reserved.
func (b *bodyBudget) inFlight() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}
