package pgwait_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/pgwait"
)

func TestMain(m *testing.M) {
	// pgxpool's background health check ends after the test's pool.Close.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// newPool returns a pool of one connection on a database of its own, traced (Tracer), closed at
// the test's end.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t) + "&pool_max_conns=1")
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = pgwait.Tracer{}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// TestBound_WaitForAConnection: a Bound context waits for a pool connection at most its bound,
// then is canceled with ErrTimeout; a context without one waits as before; a connection that
// came in time leaves the context alive.
func TestBound_WaitForAConnection(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	base, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, err := pool.Acquire(base)
	require.NoError(t, err)

	ctx, done := pgwait.Bound(base, 50*time.Millisecond)
	var one int
	err = pool.QueryRow(ctx, `SELECT 1`).Scan(&one)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, pgwait.TimedOut(ctx, err))
	require.ErrorIs(t, context.Cause(ctx), pgwait.ErrTimeout)
	done()

	unbounded, stop := context.WithTimeout(base, 100*time.Millisecond)
	err = pool.QueryRow(unbounded, `SELECT 1`).Scan(&one)
	stop()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, pgwait.TimedOut(unbounded, err))
	_, ok := pgwait.Wait(unbounded)
	require.False(t, ok)

	held.Release()
	ctx, done = pgwait.Bound(base, 50*time.Millisecond)
	defer done()
	require.NoError(t, pool.QueryRow(ctx, `SELECT 1`).Scan(&one))
	w, ok := pgwait.Wait(ctx)
	require.True(t, ok)
	require.Equal(t, 50*time.Millisecond, w)
	select {
	case <-ctx.Done():
		t.Fatal("a connection that came in time must leave the context alive")
	case <-time.After(150 * time.Millisecond): // three bounds: a timer left running would have fired
	}
}

// TestTracer_AcquireAllocs pins the allocations of a bound on an acquire: none, once the
// context's first acquire made its timer. Each acquire made a timer, its func, a channel, their
// struct and a context (5 allocations), an idle connection's included: a submit's statements
// each take one.
func TestTracer_AcquireAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	ctx, done := pgwait.Bound(context.Background(), time.Minute)
	defer done()
	var tr pgwait.Tracer
	acquire := func() {
		tr.TraceAcquireEnd(tr.TraceAcquireStart(ctx, nil, pgxpool.TraceAcquireStartData{}), nil, pgxpool.TraceAcquireEndData{})
	}
	acquire() // the context's timer, made once
	allocs := testing.AllocsPerRun(200, acquire)
	t.Logf("%.1f allocations", allocs)
	require.Zero(t, allocs, "allocations per bounded acquire")
	require.NoError(t, ctx.Err())
}

// TestBound_Allocs pins the allocations of a Bound context and its end, its cancel called where
// it was made (Bound is inlined: its cancel needs no closure then, nor when dropped): 3, the
// cancel context, its cancel and the context carrying the bound. The bound had a context of its
// own around it, and the cancel a closure around the cancel context's: 5, a poll's, a submit's
// and a stream's each, and a delivery's waits each. Bound(ctx, 0) carries no bound of its own:
// an outer one still bounds its waits.
func TestBound_Allocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("allocation counts vary under the race detector")
	}
	allocs := testing.AllocsPerRun(200, func() {
		ctx, done := pgwait.Bound(context.Background(), time.Minute)
		if _, ok := pgwait.Wait(ctx); !ok {
			panic("no bound")
		}
		done()
	})
	t.Logf("%.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 3.0, "allocations per Bound")

	outer, done := pgwait.Bound(context.Background(), time.Minute)
	defer done()
	inner, innerDone := pgwait.Bound(outer, 0)
	wait, ok := pgwait.Wait(inner)
	require.True(t, ok)
	require.Equal(t, time.Minute, wait)
	innerDone()
	require.ErrorIs(t, context.Cause(inner), context.Canceled)
	require.NoError(t, outer.Err())
	child, childDone := context.WithCancel(outer)
	defer childDone()
	require.True(t, pgwait.Expire(child))
	require.ErrorIs(t, context.Cause(child), pgwait.ErrTimeout)
	require.True(t, pgwait.TimedOut(outer, nil))
}

// TestTracer_AcquiresShareAContext: the acquires under one Bound context, one after the other,
// concurrent or one made within another, each wait at most the bound: the timer they reuse is
// armed anew for each, and an acquire that finds it taken starts one of its own.
func TestTracer_AcquiresShareAContext(t *testing.T) {
	t.Parallel()
	var tr pgwait.Tracer
	start := func(ctx context.Context) context.Context {
		return tr.TraceAcquireStart(ctx, nil, pgxpool.TraceAcquireStartData{})
	}
	end := func(ctx context.Context) { tr.TraceAcquireEnd(ctx, nil, pgxpool.TraceAcquireEndData{}) }
	fired := func(t *testing.T, ctx context.Context) {
		t.Helper()
		select {
		case <-ctx.Done():
			require.ErrorIs(t, context.Cause(ctx), pgwait.ErrTimeout)
		case <-time.After(30 * time.Second):
			t.Fatal("the bound did not end the wait")
		}
	}

	t.Run("OneAfterTheOther", func(t *testing.T) {
		t.Parallel()
		ctx, done := pgwait.Bound(context.Background(), 20*time.Millisecond)
		defer done()
		end(start(ctx)) // served at once: its timer stopped
		require.NoError(t, ctx.Err())
		waiting := start(ctx) // the same timer, armed anew
		fired(t, ctx)
		end(waiting)
	})
	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		ctx, done := pgwait.Bound(context.Background(), 20*time.Millisecond)
		defer done()
		first := start(ctx)
		second := start(ctx) // finds the context's timer taken: one of its own
		require.NotEqual(t, first, second)
		end(first)
		fired(t, ctx)
		end(second)
	})
	t.Run("WithinAnother", func(t *testing.T) {
		t.Parallel()
		ctx, done := pgwait.Bound(context.Background(), time.Hour)
		defer done()
		outer := start(ctx)
		own := start(ctx)
		inner := start(own) // within an acquire with a timer of its own: never the context's
		require.NotEqual(t, own, inner)
		end(inner)
		end(own)
		end(outer)
		require.Equal(t, ctx, start(ctx), "the context's timer is free again")
		end(ctx)
		require.NoError(t, ctx.Err())
	})
	t.Run("WithinAnOwnTimer", func(t *testing.T) {
		t.Parallel()
		ctx, done := pgwait.Bound(context.Background(), 20*time.Millisecond)
		defer done()
		shared := start(ctx)
		own := start(ctx) // the context's timer taken: one of its own
		end(shared)       // the context's timer free again
		// Within the acquire with a timer of its own, the context's free timer is not taken: the
		// inner acquire's end would stop the outer's timer (its context carries it), leaving the
		// outer's wait unbounded and the context's timer taken for good.
		inner := start(own)
		require.NotEqual(t, own, inner)
		end(inner)
		fired(t, ctx) // the outer's own timer bounds its wait still
		end(own)
		require.Equal(t, ctx, start(ctx), "the context's timer is free again")
		end(ctx)
	})
}

// TestTracer_ConcurrentAcquires: acquires under one Bound context from many goroutines at once
// (a request's statements run side by side) take the context's timer one at a time, each other
// making its own, without a data race (go test -race) and without a bound firing: every acquire
// ended in time. Once they are over, the context's timer is free.
func TestTracer_ConcurrentAcquires(t *testing.T) {
	t.Parallel()
	var tr pgwait.Tracer
	ctx, done := pgwait.Bound(context.Background(), time.Hour)
	defer done()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 500 {
				tr.TraceAcquireEnd(tr.TraceAcquireStart(ctx, nil, pgxpool.TraceAcquireStartData{}), nil, pgxpool.TraceAcquireEndData{})
			}
		})
	}
	wg.Wait()
	require.NoError(t, ctx.Err())
	acquire := tr.TraceAcquireStart(ctx, nil, pgxpool.TraceAcquireStartData{})
	require.Equal(t, ctx, acquire, "the context's timer is free")
	tr.TraceAcquireEnd(acquire, nil, pgxpool.TraceAcquireEndData{})
}

// TestBound_EachAcquireWaitsItsBound: a Bound context's second acquire, its first served at once,
// still waits at most the bound (the timer its acquires share is armed anew).
func TestBound_EachAcquireWaitsItsBound(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	base, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	warm, err := pool.Acquire(base) // the connection, dialed: idle for the first acquire
	require.NoError(t, err)
	warm.Release()

	ctx, done := pgwait.Bound(base, 50*time.Millisecond)
	defer done()
	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer held.Release()
	require.NoError(t, ctx.Err())
	_, err = pool.Acquire(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.True(t, pgwait.TimedOut(ctx, err))
}
