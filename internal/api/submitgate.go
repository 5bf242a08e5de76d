package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// keyedSubmitGate caps each tenant's submits with an Idempotency-Key in their Postgres stage on
// this replica. Such a submit holds a pool connection of its own for its transaction (the key's
// claim, then the insert), and a claim waits in Postgres for another not yet committed of the
// same key: without a cap, one tenant's flood of them (or a client resending under one key) took
// every connection of the pool, and every other tenant's submits, polls and cancels waited
// behind it until their bound (503 overloaded). A submit without a key is not counted: it shares
// batched round trips (jobs.Store's batcher) with the others, one connection for all. It is safe
// for concurrent use.
type keyedSubmitGate struct {
	max int
	mu  sync.Mutex
	// tenants holds the tenants with a submit in the gate or waiting for a place, by name.
	tenants map[string]*gateSlots
}

// gateSlots is one tenant's places: a token in sem for each submit in the gate; users counts
// those and the submits waiting for a place (the entry goes when it drops to 0).
type gateSlots struct {
	sem   chan struct{}
	users int
}

func newKeyedSubmitGate(max int) *keyedSubmitGate {
	return &keyedSubmitGate{max: max, tenants: map[string]*gateSlots{}}
}

// enter takes one of the tenant's places, waiting for one at most wait (or ctx's end). Past
// wait it answers 429 too_many_submits with Retry-After: the tenant's own submits fill its
// places. Call release once when the submit's Postgres stage ends.
func (g *keyedSubmitGate) enter(ctx context.Context, tenant string, wait time.Duration) (release func(), err error) {
	g.mu.Lock()
	slots := g.tenants[tenant]
	if slots == nil {
		slots = &gateSlots{sem: make(chan struct{}, g.max)}
		g.tenants[tenant] = slots
	}
	slots.users++
	g.mu.Unlock()
	leave := func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if slots.users--; slots.users == 0 {
			delete(g.tenants, tenant)
		}
	}
	select {
	case slots.sem <- struct{}{}:
	default:
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case slots.sem <- struct{}{}:
		case <-t.C:
			leave()
			return nil, &httpError{status: http.StatusTooManyRequests, typ: "too_many_submits",
				message: fmt.Sprintf("tenant %q has %d submits with an Idempotency-Key in progress on this server, its limit, and none ended within %s; retry after 1 s",
					tenant, g.max, wait),
				header: http.Header{"Retry-After": {"1"}}}
		case <-ctx.Done():
			leave()
			return nil, context.Cause(ctx)
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-slots.sem
			leave()
		})
	}, nil
}
