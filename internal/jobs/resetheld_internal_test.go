package jobs

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// A batch that goes unanswered empties the pool (abandonSilent), and a session that holds one of
// the pool's connections for long (a leader's advisory lock, a credential pause) must keep it,
// and its locks, until it lets go: Reset closes idle connections only, and a connection in use
// when it comes back. The session held here is made after the freeze, so that only the pool's
// idle connections are silent: a held connection that was frozen too would never answer the
// checks below (a check without a deadline then waits for ever, as an earlier version of this
// test did, until go test's timeout).
func TestBatcher_EmptyingThePoolKeepsASessionInUse(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	proxy, viaProxy := pgtest.NewProxy(t, dbURL)
	pool, err := pgxpool.New(ctx, viaProxy+"&pool_max_conns=4")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Before the pool's close, which waits for its connections: a ping still waiting on a silent
	// one ends with it.
	t.Cleanup(proxy.Cut)
	// The job is made through a store with the batches' own bound: its statement is the pool's
	// first, and waits for a connection made through the proxy, which a loaded machine (the
	// package's tests run with -race beside others) took past the short bound below to make
	// ("create job: context deadline exceeded").
	job, _, err := NewStore(pool, nil).Create(ctx, cutTestParams)
	require.NoError(t, err)
	s := NewStore(pool, nil)
	s.batch.timeout = time.Second

	// Given two of the pool's connections, idle, that fall silent
	warmPool(ctx, t, pool, 2)
	silent := []*pgxpool.Conn{}
	for range 2 {
		c, err := pool.Acquire(ctx)
		require.NoError(t, err)
		silent = append(silent, c)
	}
	proxy.Freeze()
	// And a session on a connection of the pool made after, holding an advisory lock
	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer held.Release()
	const key = 7_240_113
	var pid int32
	require.NoError(t, held.QueryRow(within(ctx, t, 5*time.Second),
		"SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock($1)) l", int64(key)).Scan(&pid))
	for _, c := range silent {
		c.Release()
	}

	// When a statement goes out on a silent connection, and the probe finds the other silent
	// (the pool is emptied)
	_, err = s.Get(within(ctx, t, 30*time.Second), job.ID)
	require.Error(t, err)
	require.True(t, IsUnavailable(err), "%v", err)

	// Then the held session still answers, and holds its lock
	direct, err := pgx.Connect(within(ctx, t, 5*time.Second), dbURL)
	require.NoError(t, err)
	defer direct.Close(context.Background())
	var locked bool
	require.NoError(t, held.QueryRow(within(ctx, t, 5*time.Second),
		`SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND objid = $1
			AND pid = pg_backend_pid() AND granted)`, key).Scan(&locked))
	require.True(t, locked, "the held session lost its advisory lock when the pool was emptied")
	var taken bool
	require.NoError(t, direct.QueryRow(within(ctx, t, 5*time.Second),
		"SELECT pg_try_advisory_lock($1)", int64(key)).Scan(&taken))
	require.False(t, taken, "another session took the held session's lock")
	// And the store answers on a new connection
	got, err := s.Get(within(ctx, t, 30*time.Second), job.ID)
	require.NoError(t, err)
	require.Equal(t, job.ID, got.ID)

	// And once the session lets go, its connection is closed (the pool was emptied), the lock
	// with it
	held.Release()
	require.Eventually(t, func() bool {
		var gone bool
		err := direct.QueryRow(within(ctx, t, 5*time.Second),
			"SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&gone)
		return err == nil && gone
	}, 30*time.Second, 20*time.Millisecond, "the held session's connection outlived its release after the pool was emptied")
}

// within returns ctx bounded by d, canceled when the test ends.
func within(ctx context.Context, t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(ctx, d)
	t.Cleanup(cancel)
	return ctx
}
