package executor

import (
	"context"
	"sync/atomic"
)

// backlogGate bounds how many deliveries of low-priority jobs run their steps before the call
// (load, guard, breaker, admission, and a refusal's deferral) at once in one process. A backlog's
// first pass (each of thousands of tasks loaded, refused its turn and deferred) otherwise fills
// every worker slot with bookkeeping that shares the process's Postgres connections and CPU
// with an interactive job's steps, which then wait about as long as the pass's in-flight count
// times a step (see docs/decisions.md, "A backlog's pass goes through a gate"). The call, and
// any wait for a slot or a retry delay, are outside the gate, so low work still uses the whole
// limit.
type backlogGate struct {
	places chan struct{} // nil: no bound
	// waiting is how many passes wait for a place now: what a test reads to know a delivery
	// reached the gate, which nothing else tells while the delivery waits.
	waiting atomic.Int32
}

// newBacklogGate returns a gate of n places; n ≤ 0: no bound.
func newBacklogGate(n int) *backlogGate {
	if n <= 0 {
		return &backlogGate{}
	}
	return &backlogGate{places: make(chan struct{}, n)}
}

// gatePass is one delivery's hold on a place in a backlogGate. It belongs to the delivery's
// goroutine.
type gatePass struct {
	g    *backlogGate
	held bool
	// left: the pass gave its place up (leave) and has not taken one since; a delivery that
	// left it for an inline wait takes one again (rejoin) before its steps after the wait.
	left bool
	// movedFrom is the credentials the delivery moved its job off (failOver) and has not logged
	// yet, which the pass, the delivery's own state, carries through its runs on the fallbacks
	// for one log line (Executor.logMoves); moveReason is why it left the first of them.
	movedFrom  []string
	moveReason string
}

// enter takes a place unless the pass holds one, waiting for it until ctx ends. Without a bound
// it returns at once.
func (p *gatePass) enter(ctx context.Context) error {
	if p.held || p.g.places == nil {
		return nil
	}
	select {
	case p.g.places <- struct{}{}:
		p.held, p.left = true, false
		return nil
	default:
	}
	p.g.waiting.Add(1)
	defer p.g.waiting.Add(-1)
	select {
	case p.g.places <- struct{}{}:
		p.held, p.left = true, false
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// leave gives the place back, if the pass holds one.
func (p *gatePass) leave() {
	if p.held {
		p.held, p.left = false, true
		<-p.g.places
	}
}

// rejoin takes a place again, waiting for it until ctx ends, if the pass left the one it held
// (a low job's delivery that waited inline: a retry delay, a breaker's cooldown or cap). The
// steps after such a wait (the breaker's and the limiter's asks, a deferral's write) are bounded
// as those before it: a breaker that closes, or a delay that ends, for every low delivery of a
// process at once would otherwise send them all to Redis and Postgres together. A pass that
// never held a place (a normal or high job's) returns at once.
func (p *gatePass) rejoin(ctx context.Context) error {
	if !p.left {
		return nil
	}
	return p.enter(ctx)
}
