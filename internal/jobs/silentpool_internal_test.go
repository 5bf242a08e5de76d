package jobs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// When the pool's connections fall silent together (a partition, a failover behind a moved
// address), the first batch that goes out on one waits its bound and fails. The pool still held
// the others, open and silent, and handed them out one by one: each cost the process's next
// batch its whole bound (30 s), every transition of the process queued behind it. A batch that
// runs out of its bound now empties the pool: the next statement goes out on a new connection.
func TestBatcher_SilentPoolCostsOneBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	const conns = 4
	pool, err := pgxpool.New(ctx, viaProxy+"&pool_max_conns=4")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Before the pool's close, which waits for its connections: a ping still waiting on a silent
	// one ends with it.
	t.Cleanup(proxy.Cut)
	s := NewStoreOpts(pool, StoreOpts{BatchTimeout: time.Second})
	job, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)
	// The pool holds conns open connections, idle.
	warmPool(ctx, t, pool, conns)

	// When every one of them falls silent
	proxy.Freeze()

	// Then the first statement out fails at its batch's bound
	_, err = s.Get(ctx, job.ID)
	require.Error(t, err)
	require.True(t, IsUnavailable(err), "%v", err)

	// And the next ones go out on new connections, answered
	for i := range conns {
		got, err := s.Get(ctx, job.ID)
		require.NoError(t, err, "statement %d after the first silent connection", i+1)
		require.Equal(t, job.ID, got.ID)
	}
}

// A statement that gave up on its bound while every connection of the pool was in use (a slow
// server, a long transaction on each) left the probe (abandonSilent) no connection to ping: it
// waited for one its whole time and, getting none, emptied the pool as if it were silent. The
// connections in use, answering, were closed as they came back and made again, loading the
// slow server more. The probe pings a connection the pool holds idle (what emptying it would
// close now); with none idle it empties nothing: a connection in use that is silent is closed
// by pgx when its statement gives up. A full pool with one idle connection, silent, is emptied
// as before.
func TestBatcher_FullPoolProbe(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// idleSilent: one of the pool's connections is left idle and falls silent with the
		// others (in use).
		idleSilent bool
		wantKept   bool
	}{
		{name: "EveryConnectionInUseIsKept", wantKept: true},
		{name: "AnIdleSilentConnectionEmptiesIt", idleSilent: true, wantKept: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			proxy, pool, b, gaveUp := probeSetup(ctx, t)
			made := pool.Stat().NewConnsCount()
			var err error
			inUse := probeConns
			if tc.idleSilent {
				inUse--
			}
			held := make([]*pgxpool.Conn, inUse)
			for i := range held {
				held[i], err = pool.Acquire(ctx)
				require.NoError(t, err)
			}
			if tc.idleSilent {
				proxy.Freeze()
			}

			// When a statement gives up on its bound
			probed := make(chan struct{})
			go func() {
				defer close(probed)
				b.abandonSilent(gaveUp)
			}()
			select {
			case <-probed:
			case <-ctx.Done():
				t.Fatal("the probe did not end")
			}

			// Then the connections in use go back to the pool, or are closed if it was emptied
			for _, c := range held {
				c.Release()
			}
			if tc.wantKept {
				require.Equal(t, int32(probeConns), pool.Stat().IdleConns(), "the pool was emptied of connections in use, answering")
				require.Equal(t, made, pool.Stat().NewConnsCount())
				got, err := pool.Exec(within(ctx, t, 5*time.Second), "SELECT 1")
				require.NoError(t, err)
				require.Equal(t, int64(1), got.RowsAffected())
			} else {
				require.Zero(t, pool.Stat().IdleConns(), "a pool whose idle connection is silent is kept")
			}
		})
	}
}

// The probe took every connection the pool held idle and kept them all through its ping: on a
// slow server (the pool a batch ran out of its bound on, and whose ping may take the probe's
// whole 2 s) the process's other statements found no connection idle meanwhile, and waited or
// made new ones to the slow server. The probe pings one of them and gives the others back at
// once.
func TestBatcher_ProbeKeepsThePoolInUse(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	proxy, pool, b, gaveUp := probeSetup(ctx, t)
	made := pool.Stat().NewConnsCount()
	// The probe's ping is slow to be answered (held until released).
	ping := proxy.HoldStatement("-- ping")
	defer ping.Release()

	// When a statement gives up on its bound, and the probe pings
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		b.abandonSilent(gaveUp)
	}()
	select {
	case <-ping.Reached():
	case <-ctx.Done():
		t.Fatal("the probe did not ping")
	}

	// Then another statement goes out meanwhile, on a connection of the pool
	got, err := pool.Exec(within(ctx, t, 5*time.Second), "SELECT 1")
	require.NoError(t, err, "no connection while the probe pings")
	require.Equal(t, int64(1), got.RowsAffected())
	require.Equal(t, made, pool.Stat().NewConnsCount(), "a connection was made while the probe pings")
	// And the pool, answering, is kept
	ping.Release()
	select {
	case <-probed:
	case <-ctx.Done():
		t.Fatal("the probe did not end")
	}
	require.Equal(t, int32(probeConns), pool.Stat().IdleConns())
	require.Equal(t, made, pool.Stat().NewConnsCount())
}

// probeConns is the pool size of the probe's tests.
const probeConns = 3

// probeSetup is a probe's test bench: a batcher on a pool of probeConns connections, all made,
// through proxy (cut before the pool closes, which waits for its connections), and gaveUp, a
// batch's context that ran out of its bound.
func probeSetup(ctx context.Context, t *testing.T) (proxy *pgtest.Proxy, pool *pgxpool.Pool, b *batcher, gaveUp context.Context) {
	t.Helper()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	pool, err := pgxpool.New(ctx, viaProxy+fmt.Sprintf("&pool_max_conns=%d", probeConns))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Cut)
	b = &batcher{pool: pool, timeout: time.Hour}
	gaveUp, stop := context.WithTimeoutCause(ctx, 0, errBatchTimeout)
	t.Cleanup(stop)
	<-gaveUp.Done()
	warmPool(ctx, t, pool, probeConns)
	return proxy, pool, b, gaveUp
}
