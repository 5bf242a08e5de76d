package pgwait_test

import (
	"context"
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

// TestBound_WaitForAConnection: a Bound context waits for a pool connection at most its bound,
// then is canceled with ErrTimeout; a context without one waits as before; a connection that
// came in time leaves the context alive.
func TestBound_WaitForAConnection(t *testing.T) {
	t.Parallel()
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t) + "&pool_max_conns=1")
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = pgwait.Tracer{}
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	base, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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
