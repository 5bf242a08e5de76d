package api

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
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
