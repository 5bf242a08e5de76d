package jobs

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// lockRowSQL is a statement of the batcher's kind that waits for its job's row lock.
const lockRowSQL = `SELECT id FROM jobs WHERE id = $1 FOR UPDATE`

// warmPool makes the pool hold n open connections, idle.
func warmPool(ctx context.Context, t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	held := make([]*pgxpool.Conn, n)
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
	require.Equal(t, int32(n), pool.Stat().IdleConns())
}

// lockRows takes the rows of ids in the database at dbURL in a transaction of another pool, held
// until the test ends or the returned release is called.
func lockRows(ctx context.Context, t *testing.T, dbURL string, ids ...string) (release func()) {
	t.Helper()
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	tx, err := direct.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	for _, id := range ids {
		_, err := tx.Exec(ctx, lockRowSQL, id)
		require.NoError(t, err)
	}
	return func() { require.NoError(t, tx.Rollback(ctx)) }
}

// A batch whose server answered its first statement and then ran out of its bound (a slow
// server: here a row lock waited for past a bound shorter than the lock's) met a server that
// answers. Emptying the pool then had every connection of the process made again at each slow
// batch, loading the server more: the pool keeps its connections.
func TestBatcher_SlowAnswerKeepsThePool(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=4")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// The set-up and the check run at the default bound (a loaded machine's Create has taken
	// longer than 500 ms); only the slow statement runs at the short one.
	unhurried := NewStore(pool, nil)
	s := NewStoreOpts(pool, StoreOpts{BatchTimeout: 500 * time.Millisecond}) // under batchLockTimeout: the lock wait outlasts it
	job, _, err := unhurried.Create(ctx, cutTestParams)
	require.NoError(t, err)
	lockRows(ctx, t, dbURL, job.ID)
	warmPool(ctx, t, pool, 4)
	made := pool.Stat().NewConnsCount()

	// When a statement runs out of its bound on a connection that answered
	err = s.batch.queryRow(ctx, job.ID, lockRowSQL, []any{job.ID}, func(r pgx.Row) error { var id string; return r.Scan(&id) })
	require.Error(t, err)

	// Then the next statement goes out on one of the connections the pool kept
	got, err := unhurried.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, job.ID, got.ID)
	require.Equal(t, made, pool.Stat().NewConnsCount(), "connections made again after a slow answer")
}

// Statements that give up on a silent pool (a batch, then each of its statements alone, each
// at its bound) emptied the pool each time: every connection made meanwhile was closed again.
// The pool is emptied at most once per bound.
func TestBatcher_EmptiesThePoolOncePerBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	pool, err := pgxpool.New(ctx, viaProxy+"&pool_max_conns=3")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	t.Cleanup(proxy.Cut) // before the pool's close, which waits for its connections
	// (A connection that gave no answer keeps its place in the pool while pgx closes it, up to
	// 15 s: the pool has room for two more.)
	b := &batcher{pool: pool, timeout: time.Hour}
	gaveUp, stop := context.WithTimeoutCause(ctx, 0, errBatchTimeout)
	defer stop()
	<-gaveUp.Done()

	warmPool(ctx, t, pool, 2)
	proxy.Freeze()
	b.abandonSilent(gaveUp)
	require.Zero(t, pool.Stat().IdleConns(), "the first statement that gave up on a silent pool empties it")

	warmPool(ctx, t, pool, 2)
	proxy.Freeze()
	b.abandonSilent(gaveUp)
	require.Equal(t, int32(2), pool.Stat().IdleConns(), "a second one within the bound keeps it")
}

// Many locked rows, each outcome tried again beside the batches (Alone): each try held a pool
// connection for the lock's bound, and with as many locked rows as connections, the batches
// (every other job's transitions) waited for one. At most a quarter of the pool waits on
// locked rows; a try beyond that is refused at once, to be tried again. The lock's bound is an
// hour here: a read that waited for a connection to come back from a lock wait is not answered
// within the test's deadline, however slow the machine.
func TestBatcher_AloneKeepsThePoolForBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const conns = 4
	dbURL := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=4")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := NewStoreOpts(pool, StoreOpts{LockTimeout: time.Hour, BatchTimeout: time.Hour})
	ids := make([]string, conns)
	for i := range ids {
		job, _, err := s.Create(ctx, cutTestParams)
		require.NoError(t, err)
		ids[i] = job.ID
	}
	other, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)
	unlock := lockRows(ctx, t, dbURL, ids...)
	probe, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(probe.Close)

	// When as many statements as the pool has connections wait for locked rows, beside the batches
	errs := make(chan error, conns)
	for _, id := range ids {
		go func() {
			errs <- s.batch.queryRow(Alone(ctx), id, lockRowSQL, []any{id},
				func(r pgx.Row) error { var id string; return r.Scan(&id) })
		}()
	}
	var refused []error
	require.Eventually(t, func() bool {
		for len(errs) > 0 {
			refused = append(refused, <-errs)
		}
		var waiting int
		err := probe.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		return err == nil && waiting > 0 && waiting+len(refused) == conns
	}, 30*time.Second, time.Millisecond, "each statement waits for its row or is refused")
	for _, err := range refused {
		require.True(t, IsLockTimeout(err), "a statement that ended before its row was let go: %v", err)
	}

	// Then another job's read is answered meanwhile
	got, err := s.Get(ctx, other.ID)
	require.NoError(t, err, "a read of another job while statements wait for locked rows")
	require.Equal(t, other.ID, got.ID)

	// And once the rows are let go, the statements that waited for them take them
	unlock()
	for range conns - len(refused) {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("a statement waiting for its row did not end")
		}
	}
}

// A statement run Alone that found every slot beside the batches taken was answered with a
// made-up server error (SQLSTATE 55P03): logged as Postgres's answer to a statement never sent.
// It is an error of its own now, which callers still take for a lock wait past its bound (to
// be tried again) and for Postgres unavailable.
func TestBatcher_BesideFullIsNotAServerAnswer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, pgtest.URL(t)+"&pool_max_conns=4")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := NewStore(pool, nil)
	job, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)
	// The one slot beside the batches (a quarter of 4 connections) is taken.
	release, ok := s.batch.takeBeside()
	require.True(t, ok)
	defer release()

	_, err = s.Get(Alone(ctx), job.ID)

	require.Error(t, err)
	require.True(t, IsLockTimeout(err), "%v", err)
	require.True(t, IsUnavailable(err), "%v", err)
	var pgErr *pgconn.PgError
	require.False(t, errors.As(err, &pgErr), "a statement never sent answered as Postgres's error: %v", err)
	require.NotContains(t, err.Error(), "SQLSTATE")
}
