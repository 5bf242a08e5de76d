package jobs

import (
	"context"
	"sync"
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
	s := NewStore(pool, nil)
	s.batch.timeout = time.Second
	job, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)
	// The pool holds conns open connections, idle.
	held := make([]*pgxpool.Conn, conns)
	var wg sync.WaitGroup
	for i := range held {
		wg.Go(func() {
			c, err := pool.Acquire(ctx)
			if err == nil {
				err = c.Ping(ctx)
			}
			require.NoError(t, err)
			held[i] = c
		})
	}
	wg.Wait()
	for _, c := range held {
		c.Release()
	}
	require.Equal(t, int32(conns), pool.Stat().IdleConns())

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
