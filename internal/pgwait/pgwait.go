// Package pgwait bounds how long a request waits for a connection of a pgx pool. pgxpool queues
// every Acquire without a limit for as long as its context lasts; an HTTP request's context lasts
// as long as its client waits, which on a pool whose every connection is taken (a burst, a
// stalled server) outlived the server's write timeout: the client got its connection cut, no
// answer. A context marked with Bound waits at most its bound for each connection, then is
// canceled with the cause ErrTimeout, before anything was sent on a connection.
//
// The bound needs the pool built with Tracer (as its ConnConfig.Tracer); without it, Bound's
// context is only cancelable.
package pgwait

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrTimeout is the cause of a Bound context canceled because a pool connection did not come
// free within its bound. Nothing of the statement that waited was sent.
var ErrTimeout = errors.New("no Postgres connection came free in time")

// TimedOut reports whether ctx was canceled by its bound (or err is ErrTimeout).
func TimedOut(ctx context.Context, err error) bool {
	return errors.Is(err, ErrTimeout) || errors.Is(context.Cause(ctx), ErrTimeout)
}

type boundKey struct{}

// bound is a Bound context's limit and the cancel of that context, and the timer its acquires
// reuse one after the other (Tracer).
type bound struct {
	wait   time.Duration
	cancel context.CancelCauseFunc
	// busy is held by the acquire whose wait timer bounds; another acquire under the context
	// meanwhile (concurrent, or made within that acquire) makes a timer of its own.
	busy atomic.Bool
	// timer, made at the first acquire and reset at the next ones, is written only by busy's
	// holder.
	timer *time.Timer
}

// expire cancels the Bound context with the cause ErrTimeout: its wait for a connection lasted
// its bound.
func (b *bound) expire() { b.cancel(ErrTimeout) }

// boundCtx is a Bound context: the cancel context, which it is (its Done, Err and the cancel
// context's own key are the embedded one's: a child of it is that context's child, as a child of
// a context.WithValue's is), carrying its bound itself. The bound had a WithValue context of its
// own, and Bound's cancel a closure around the cancel context's: 5 allocations a Bound, 3 now.
type boundCtx struct {
	context.Context
	bound
}

// Value is the bound for boundKey (when it has one: a wait > 0), else the cancel context's value
// for key.
func (c *boundCtx) Value(key any) any {
	if _, ok := key.(boundKey); ok && c.wait > 0 {
		return &c.bound
	}
	return c.Context.Value(key)
}

// stop ends c as Bound's cancel does: without a cause.
func (c *boundCtx) stop() { c.cancel(nil) }

// Bound returns a child of ctx whose every wait for a pool connection (on a pool with Tracer)
// lasts at most wait: past it the child is canceled with the cause ErrTimeout, so the statement
// that waited, and all that follow under the child, fail without being sent. wait ≤ 0 returns a
// child without a bound. Call cancel when done.
func Bound(ctx context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	// Small enough to be inlined: a caller that drops the cancel (the end of ctx ends the child)
	// makes no closure for it.
	c := bind(ctx, wait)
	return c, c.stop
}

// bind returns Bound's context, with a bound of wait when wait > 0. It is not inlined: Bound,
// with context.WithCancelCause inlined into it, would be too large to be inlined itself.
//
//go:noinline
func bind(ctx context.Context, wait time.Duration) *boundCtx {
	ctx, cancel := context.WithCancelCause(ctx)
	return &boundCtx{Context: ctx, bound: bound{wait: wait, cancel: cancel}}
}

// Wait is ctx's bound, and whether it has one.
func Wait(ctx context.Context) (time.Duration, bool) {
	b, ok := ctx.Value(boundKey{}).(*bound)
	if !ok || b == nil {
		return 0, false
	}
	return b.wait, true
}

// Expire ends ctx's bound now, as its bound ends it: it cancels the Bound context with the cause
// ErrTimeout. It is for a wait for a connection that the Tracer does not see (another's Acquire
// made on ctx's behalf: a batch of statements of several callers), and must be called only while
// nothing of ctx's statement was sent. It reports whether ctx has a bound.
func Expire(ctx context.Context) bool {
	b, ok := ctx.Value(boundKey{}).(*bound)
	if !ok || b == nil {
		return false
	}
	b.cancel(ErrTimeout)
	return true
}

// Unbound returns ctx without its bound: its waits for a pool connection last as long as ctx
// does (its end, a bound that fired already included, still ends them). It is for a statement
// that may have taken effect already (run again after its connection broke under it, its commit
// answer lost): its caller needs its answer, not ErrTimeout, which says nothing was sent.
func Unbound(ctx context.Context) context.Context {
	if _, ok := Wait(ctx); !ok {
		return ctx
	}
	return context.WithValue(ctx, boundKey{}, (*bound)(nil))
}

// Tracer applies Bound's limits to the waits of a pool's Acquire: set it as the pool's
// ConnConfig.Tracer. It traces nothing else (its query hooks do nothing).
type Tracer struct{}

var (
	_ pgx.QueryTracer       = Tracer{}
	_ pgxpool.AcquireTracer = Tracer{}
)

// TraceQueryStart does nothing.
func (Tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

// TraceQueryEnd does nothing.
func (Tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// timerKey marks the context of an acquire whose wait has a timer of its own (TraceAcquireStart),
// not its bound's.
type timerKey struct{}

// TraceAcquireStart starts the bound of a Bound context's wait. The acquires under a context,
// one after the other, reuse its timer: a timer, its func and its context made at every acquire
// were 5 allocations, an idle connection's included. An acquire made while another holds the
// timer (the same context's, concurrent or made within it) starts one of its own.
func (Tracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	b, ok := ctx.Value(boundKey{}).(*bound)
	if !ok || b == nil {
		return ctx
	}
	// TraceAcquireEnd takes the bound's timer for an acquire whose context carries none of its
	// own: an acquire made within one that has its own (ctx carries it) makes its own too.
	if ctx.Value(timerKey{}) == nil && b.busy.CompareAndSwap(false, true) {
		if b.timer == nil {
			b.timer = time.AfterFunc(b.wait, b.expire)
		} else {
			b.timer.Reset(b.wait)
		}
		return ctx
	}
	return context.WithValue(ctx, timerKey{}, time.AfterFunc(b.wait, b.expire))
}

// TraceAcquireEnd ends the bound. When the timer fired already, it cancels the context itself
// (as the timer's func does, or did), so that a connection acquired just in time is handed over
// with its context already canceled (pgx sends nothing then) rather than canceled under a
// statement being sent, which might commit without its answer. The timer's func, run late, only
// cancels again the context canceled already; the next acquire's Reset cannot revive it.
func (Tracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	b, ok := ctx.Value(boundKey{}).(*bound)
	if !ok || b == nil {
		return
	}
	t, own := ctx.Value(timerKey{}).(*time.Timer)
	if !own {
		t = b.timer
	}
	if !t.Stop() {
		b.expire()
	}
	if !own {
		b.busy.Store(false)
	}
}
