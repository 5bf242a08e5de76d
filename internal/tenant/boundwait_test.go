package tenant_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/pgwait"
	"github.com/llmq/llmq/internal/tenant"
)

// boundPool is a store on a pool of one connection with pgwait.Tracer (as migrations.Open
// makes), a token of it, an Authenticator, and the pool's connection, taken: every lookup waits.
func boundPool(t *testing.T, ctx context.Context) (*tenant.Authenticator, string, *pgxpool.Conn) {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(pgtest.URL(t) + "&pool_max_conns=1")
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = pgwait.Tracer{}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := tenant.NewStore(pool, nil)
	_, token, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	held, err := pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(held.Release) // pgxpool ignores a second Release
	return tenant.NewAuthenticator(store, nil), token, held
}

// A request with a pgwait bound (an API submit) that waits for another's lookup of its token,
// a lookup without a bound (an event stream's), waits for it at most its bound while the pool
// stays full, as it would have waited for a connection of its own: it is answered by its bound
// (503 overloaded), not held until a connection comes (past the server's write timeout).
func TestAuthenticator_BoundedWaiterOfAnUnboundedLookupEndsByItsBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	auth, token, held := boundPool(t, ctx)

	looked := make(chan error, 1)
	go func() {
		_, err := auth.Authenticate(ctx, token) // no bound
		looked <- err
	}()
	require.Eventually(t, func() bool { return auth.Looking() == 1 }, 30*time.Second, time.Millisecond)
	bounded, done := pgwait.Bound(ctx, 100*time.Millisecond)
	defer done()
	waited := make(chan error, 1)
	go func() {
		_, err := auth.Authenticate(bounded, token)
		waited <- err
	}()
	select {
	case err := <-waited:
		require.Error(t, err)
		require.True(t, pgwait.TimedOut(bounded, err), "answered by its bound: %v", err)
		require.Equal(t, 1, auth.Looking(), "the unbounded lookup goes on")
	case <-time.After(30 * time.Second): // 300 bounds, under ctx's minute
		held.Release()
		t.Fatalf("the bounded request waited for another's lookup past its bound: %v", <-waited)
	}
	held.Release()
	require.NoError(t, <-looked)
}

// The other way round: a request without a bound (an event stream) that waits for a bounded
// request's lookup of its token is not failed by that request's bound (an event stream is
// answered 503 by no bound, docs/decisions.md): it looks the token up itself, and waits for
// its connection as long as it waits.
func TestAuthenticator_UnboundedWaiterOutlivesABoundedLookupsBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	auth, token, held := boundPool(t, ctx)

	// Long enough for the other request to join the lookup before it fires.
	bounded, done := pgwait.Bound(ctx, 2*time.Second)
	defer done()
	looked := make(chan error, 1)
	go func() {
		_, err := auth.Authenticate(bounded, token)
		looked <- err
	}()
	require.Eventually(t, func() bool { return auth.Looking() == 1 }, 30*time.Second, time.Millisecond)
	stayed := make(chan error, 1)
	go func() {
		got, err := auth.Authenticate(ctx, token) // no bound
		if err == nil && got.Name != "acme" {
			err = context.Canceled
		}
		stayed <- err
	}()
	require.Eventually(t, func() bool { return auth.Joined() == 1 }, 30*time.Second, time.Millisecond)
	err := <-looked
	require.True(t, pgwait.TimedOut(bounded, err), "the bounded lookup ends by its bound: %v", err)
	require.Eventually(t, func() bool { return auth.Looking() == 1 || len(stayed) == 1 }, 30*time.Second, time.Millisecond)
	held.Release()
	require.NoError(t, <-stayed, "the unbounded request looks up itself, not failed by another's bound")
}
