package api

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestReadyz_BusyPoolIsReady: a replica whose every pool connection is in use, Postgres
// answering, is ready. /readyz pinged through the pool, waited 2s for a free connection and
// answered 503 "postgres: unreachable": under load every replica could be marked not ready at
// once and taken out of service.
func TestReadyz_BusyPoolIsReady(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noListener: true})
	holdEveryConn(t, b)

	for _, method := range []string{http.MethodGet, http.MethodHead} {
		r := b.do(t, method, "/readyz", "", nil)
		require.Equal(t, http.StatusOK, r.status, "%s: %v", method, r.body)
	}
	r := b.do(t, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, map[string]any{"postgres": "ok", "redis": "ok"}, r.body)
	require.Zero(t, b.pool.Stat().TotalConns()-b.pool.Config().MaxConns, "the probe's own connection is not the pool's")
}

// TestReadyz_BusyPoolOnAGoneServerIsNotReady: a pool whose every connection is in use while
// Postgres stops answering is not ready: the check's own connection finds no server either.
func TestReadyz_BusyPoolOnAGoneServerIsNotReady(t *testing.T) {
	t.Parallel()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	b := setup(t, setupOpts{dbURL: viaProxy, noListener: true})
	holdEveryConn(t, b)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/readyz", "", nil).status, "busy, answering")

	proxy.Cut()
	r := b.do(t, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusServiceUnavailable, r.status)
	require.Equal(t, map[string]any{"postgres": "unreachable", "redis": "ok"}, r.body)
	proxy.Restore()
}

// holdEveryConn acquires every connection of b's pool until the test ends.
func holdEveryConn(t *testing.T, b *testBundle) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range b.pool.Config().MaxConns {
		c, err := b.pool.Acquire(ctx)
		require.NoError(t, err)
		t.Cleanup(c.Release) // before the pool's Close, registered earlier
	}
	require.Equal(t, b.pool.Config().MaxConns, b.pool.Stat().AcquiredConns(), "the pool is saturated")
}

// TestReadyz_BusyRedisPoolIsReady: a replica whose every Redis pool connection is in use, Redis
// answering, is ready, as with Postgres. /readyz pinged through the pool, waited for a free
// connection until its 2s ran out and answered 503 "redis: unreachable".
func TestReadyz_BusyRedisPoolIsReady(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noListener: true})
	rdb, ok := b.srv.cfg.Redis.(*redis.Client)
	require.True(t, ok, "a single-node client")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range rdb.Options().PoolSize {
		c := rdb.Conn()
		require.NoError(t, c.Ping(ctx).Err()) // holds one of the pool's connections
		t.Cleanup(func() { _ = c.Close() })
	}
	require.Zero(t, rdb.PoolStats().IdleConns, "the pool is saturated")

	r := b.do(t, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%v", r.body)
	require.Equal(t, map[string]any{"postgres": "ok", "redis": "ok"}, r.body)
	require.EqualValues(t, rdb.Options().PoolSize, rdb.PoolStats().TotalConns, "the probe's own connection is not the pool's")
}

// TestReadyz_BusyPoolOnAFullServerIsReady: a replica whose every pool connection is in use while
// Postgres refuses new connections (SQLSTATE 53300, at max_connections: here the role's
// connection limit) is ready: Postgres answers, and the replica works on the connections it
// holds. The check's own connection was refused and /readyz answered 503, so a server at its
// connection limit took every busy replica out of service at once.
func TestReadyz_BusyPoolOnAFullServerIsReady(t *testing.T) {
	t.Parallel()
	const conns = 3
	dbURL := pgtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer func() { _ = admin.Close(context.Background()) }()
	role := "llmq_test_role_" + redistest.Rand()
	_, err = admin.Exec(ctx, fmt.Sprintf("CREATE ROLE %s LOGIN CONNECTION LIMIT %d", role, conns))
	require.NoError(t, err)
	t.Cleanup(func() { // after the pool's Close, registered later
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, dbURL)
		require.NoError(t, err)
		defer func() { _ = c.Close(context.Background()) }()
		_, err = c.Exec(ctx, "DROP ROLE "+role)
		require.NoError(t, err)
	})
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(conns))
	u.RawQuery = q.Encode()
	b := setup(t, setupOpts{dbURL: u.String(), noListener: true})
	holdEveryConn(t, b)
	_, err = pgx.Connect(ctx, u.String())
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "the role is at its connection limit")
	require.Equal(t, "53300", pgErr.Code)

	r := b.do(t, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, http.StatusOK, r.status, "%v", r.body)
	require.Equal(t, map[string]any{"postgres": "ok", "redis": "ok"}, r.body)
}

// TestReadyz_DrainingIsNotReady: a replica told it is stopping (Drain, at the signal, for
// api.drain_delay before it stops listening) answers /readyz 503 with "shutdown": "draining",
// both stores answering, so that its load balancer stops sending it requests while it still
// serves them; its other routes go on answering.
func TestReadyz_DrainingIsNotReady(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noListener: true})
	b.srv.Drain()
	for _, method := range []string{http.MethodGet, http.MethodHead} {
		r := b.do(t, method, "/readyz", "", nil)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%s: %v", method, r.body)
	}
	r := b.do(t, http.MethodGet, "/readyz", "", nil)
	require.Equal(t, map[string]any{"postgres": "ok", "redis": "ok", "shutdown": "draining"}, r.body)
	require.Equal(t, http.StatusOK, b.do(t, http.MethodGet, "/healthz", "", nil).status)
}
