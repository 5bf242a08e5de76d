package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// tenantGate caps each tenant's requests that hold a pool connection of their own, for a
// transaction that may wait in Postgres, on this replica: its submits with an Idempotency-Key in
// their Postgres stage and its cancels, together. A keyed submit's transaction holds its
// connection for the key's claim, then the insert, and a claim waits in Postgres for another not
// yet committed of the same key; a cancel's statement locks its job's row, and waits for another
// transaction holding it (another cancel of the job, a worker's transition). Without a cap, one
// tenant's flood of them (a client resending under one key, or the same DELETE) took every
// connection of the pool, and every other tenant's submits, polls and cancels waited behind it
// until their bound (503 overloaded). Both kinds share the tenant's places: apart, a tenant
// flooding with both held the whole pool again. A submit without a key is not counted: it shares
// batched round trips (jobs.Store's batcher) with the others, one connection for all. It is safe
// for concurrent use.
type tenantGate struct {
	max int
	mu  sync.Mutex
	// tenants holds the tenants with a request in the gate or waiting for a place, by name.
	tenants map[string]*gateSlots
}

// gateSlots is one tenant's places: a token in sem for each request in the gate; users counts
// those and the requests waiting for a place (the entry goes when it drops to 0).
type gateSlots struct {
	sem   chan struct{}
	users int
}

func newTenantGate(max int) *tenantGate {
	return &tenantGate{max: max, tenants: map[string]*gateSlots{}}
}

// gateRefusal is the 429 of a request of one kind that found no place in a tenantGate within
// wait; max is the tenant's places.
type gateRefusal func(tenant string, max int, wait time.Duration) *httpError

// tooManySubmits refuses a keyed submit: 429 too_many_submits.
func tooManySubmits(tenant string, max int, wait time.Duration) *httpError {
	return &httpError{status: http.StatusTooManyRequests, typ: "too_many_submits",
		message: fmt.Sprintf("tenant %q has %d submits with an Idempotency-Key or cancels in progress on this server, its limit, and none ended within %s; retry after 1 s",
			tenant, max, wait),
		header: http.Header{"Retry-After": {"1"}}}
}

// tooManyCancels refuses a cancel: 429 too_many_cancels.
func tooManyCancels(tenant string, max int, wait time.Duration) *httpError {
	return &httpError{status: http.StatusTooManyRequests, typ: "too_many_cancels",
		message: fmt.Sprintf("tenant %q has %d cancels or submits with an Idempotency-Key in progress on this server, its limit, and none ended within %s; retry after 1 s",
			tenant, max, wait),
		header: http.Header{"Retry-After": {"1"}}}
}

// enter takes one of the tenant's places, waiting for one at most wait (or ctx's end). Past
// wait it answers refuse's 429 with Retry-After: the tenant's own requests fill its places. Call
// release once when the request's Postgres stage ends.
func (g *tenantGate) enter(ctx context.Context, tenant string, wait time.Duration, refuse gateRefusal) (release func(), err error) {
	slots, leave := g.join(tenant)
	select {
	case slots.sem <- struct{}{}:
	default:
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case slots.sem <- struct{}{}:
		case <-t.C:
			leave()
			return nil, refuse(tenant, g.max, wait)
		case <-ctx.Done():
			leave()
			return nil, context.Cause(ctx)
		}
	}
	return releaser(slots, leave), nil
}

// tryEnter takes one of the tenant's places if one is free now; ok is false, and nothing is
// held, when none is. Call release once when the request's Postgres stage ends.
func (g *tenantGate) tryEnter(tenant string) (release func(), ok bool) {
	slots, leave := g.join(tenant)
	select {
	case slots.sem <- struct{}{}:
		return releaser(slots, leave), true
	default:
		leave()
		return nil, false
	}
}

// join counts a request of tenant among its places' users and returns them, with leave to call
// once when it no longer holds or waits for one.
func (g *tenantGate) join(tenant string) (slots *gateSlots, leave func()) {
	g.mu.Lock()
	slots = g.tenants[tenant]
	if slots == nil {
		slots = &gateSlots{sem: make(chan struct{}, g.max)}
		g.tenants[tenant] = slots
	}
	slots.users++
	g.mu.Unlock()
	return slots, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if slots.users--; slots.users == 0 {
			delete(g.tenants, tenant)
		}
	}
}

// releaser gives a place taken in slots back, and leaves, once.
func releaser(slots *gateSlots, leave func()) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			<-slots.sem
			leave()
		})
	}
}
