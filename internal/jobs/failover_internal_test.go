package jobs

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// newFailoverStore returns a Store on a pool of four connections, all of them open and idle (as
// if used just now), and a function that ends every session on the database but its own, as a Postgres
// restart or failover does.
func newFailoverStore(t *testing.T) (*Store, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	cfg, err := pgxpool.ParseConfig(dbURL + "&pool_max_conns=4")
	require.NoError(t, err)
	// The pool pings a connection idle for over a second before handing it out: never here, as
	// for the connections of a busy pool, whatever this machine's pace.
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.EqualValues(t, 4, pool.Config().MaxConns)
	conns := make([]*pgxpool.Conn, 4)
	for i := range conns {
		conns[i], err = pool.Acquire(ctx)
		require.NoError(t, err)
		require.NoError(t, conns[i].Ping(ctx))
	}
	for _, c := range conns {
		c.Release()
	}
	terminate := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := pgx.Connect(ctx, dbURL)
		require.NoError(t, err)
		defer admin.Close(ctx)
		var n int
		require.NoError(t, admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n))
		require.Equal(t, 4, n, "the pool's sessions ended")
		// Each backend is gone once the server no longer lists it.
		require.Eventually(t, func() bool {
			var left int
			return admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&left) == nil && left == 0
		}, 30*time.Second, time.Millisecond)
	}
	return NewStore(pool, nil), terminate
}

// Postgres restarts (or fails over) between two statements: every idle connection of the pool is
// dead, and the pool hands them out unchecked (it pings only a connection idle for over a
// second: not those of a busy pool). A statement of the store must still run, on a connection that works, once the server
// is back: a submit right after a restart is not refused with a 503.
func TestStore_StatementsAfterEveryConnectionWasCutRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, terminate := newFailoverStore(t)

	// When every session ends, a create runs
	terminate()
	created, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)
	require.Equal(t, StatusQueued, created.Status)
	got, err := s.Get(ctx, created.ID)
	require.NoError(t, err)
	require.Equal(t, created.ID, got.ID)
	requireStored(t, s.Pool(), 1, 1)
}

// While Postgres cannot be reached at all, a statement is not run once per connection the pool may
// hold: a dial refused past its first try ends its tries, and the caller hears at once.
func TestStore_StatementWhilePostgresIsDownDialsOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, cutter, _ := newCutStore(t)
	created, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)

	// When Postgres goes away (one connection attempt costs the proxy perDial refusals)
	cutter.Cut()
	t.Cleanup(cutter.Restore)
	_, err = pgx.Connect(ctx, s.Pool().Config().ConnString())
	require.Error(t, err)
	perDial := cutter.Refused()
	_, err = s.Get(ctx, created.ID)

	// Then the read fails as unavailable, after two connection attempts at most (its first try's
	// and one more), not one per connection the pool may hold
	require.Error(t, err)
	require.True(t, IsUnavailable(err), "%v", err)
	require.LessOrEqual(t, cutter.Refused()-perDial, 2*perDial, "dials refused to the read")
}

// countingTracer counts the runs of the statements whose SQL holds marker.
type countingTracer struct {
	marker string
	runs   atomic.Int32
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, c.marker) {
		c.runs.Add(1)
	}
	return ctx
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The batcher sends its statements in pipelines (with their transaction's lock_timeout): those
// are counted too.
func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (c *countingTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, c.marker) {
		c.runs.Add(1)
	}
}

func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// A statement the server cancels on a connection that works (a statement_timeout while it waits
// on a row lock: SQLSTATE 57014, which reads as unavailable) is not a broken connection: it is
// run again once, as any unavailable one, not once per connection the pool may hold (each a
// statement_timeout more of waiting, with every other statement of the store queued behind it,
// and on a server canceling statements because it is overloaded, that many times its load).
func TestStore_StatementCanceledByTheServerIsNotRunOncePerConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	cfg, err := pgxpool.ParseConfig(dbURL + "&pool_max_conns=8")
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "100"
	tracer := &countingTracer{marker: "UPDATE jobs SET status = 'running', attempts = attempts + 1"}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := NewStore(pool, nil)
	// Created without the statement_timeout: on a loaded machine a create may take its 100 ms.
	created, _, err := NewStore(direct, nil).Create(ctx, cutTestParams)
	require.NoError(t, err)

	// When another transaction holds the job's row past the statement_timeout
	tx, err := direct.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, created.ID)
	require.NoError(t, err)
	_, err = s.BeginAttempt(ctx, created.ID)

	// Then the attempt's start fails, canceled by the server, after two runs at most
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "57014", pgErr.Code)
	require.LessOrEqual(t, tracer.runs.Load(), int32(2), "runs of the canceled statement")
}
