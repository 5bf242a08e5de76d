package tenant_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/pgwait"
	"github.com/llmq/llmq/internal/secrettoken"
	"github.com/llmq/llmq/internal/tenant"
)

// TestAuthenticator_NewTokenLookupsCappedKnownTokensNot: the lookups of tokens never known as a
// tenant's (made-up ones: anybody can send them) hold at most MaxNewTokenLookups connections; one
// past it waits for a place at most its pgwait bound, then ends by it (the API's 503 overloaded),
// nothing sent to Postgres. The refresh of a known token whose answer expired is not held behind
// them, nor is the first lookup's answer lost: the held one still answers unknown.
func TestAuthenticator_NewTokenLookupsCappedKnownTokensNot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	proxy, dbURL := pgtest.NewProxy(t, pgtest.URL(t))
	// exec: every lookup sends its SQL (a Parse), which the proxy's hold can recognise.
	pcfg, err := pgxpool.ParseConfig(dbURL + "&pool_max_conns=3&default_query_exec_mode=exec")
	require.NoError(t, err)
	pcfg.ConnConfig.Tracer = pgwait.Tracer{}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := tenant.NewStore(pool, nil)
	_, known, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	auth := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{Now: clock.Now, MaxNewTokenLookups: 1})
	got, err := auth.Authenticate(ctx, known)
	require.NoError(t, err)
	require.Equal(t, "acme", got.Name)
	clock.Advance(time.Minute) // acme's answer expired: its next request looks it up again
	madeUp := func() string {
		token, err := secrettoken.New(nil, tenant.BearerTokenPrefix)
		require.NoError(t, err)
		return token
	}

	// A made-up token's lookup is held on its way to Postgres: it holds the one place.
	hold := proxy.HoldStatement("WHERE token_sha256 = $1")
	defer hold.Release()
	first := make(chan error, 1)
	go func() {
		_, err := auth.Authenticate(ctx, madeUp())
		first <- err
	}()
	select {
	case <-hold.Reached():
	case <-ctx.Done():
		t.Fatal("the made-up token's lookup never reached Postgres")
	}

	// Another made-up token waits for the place at most its bound, and ends by it.
	bounded, done := pgwait.Bound(ctx, 100*time.Millisecond)
	defer done()
	_, err = auth.Authenticate(bounded, madeUp())
	require.Error(t, err)
	require.True(t, pgwait.TimedOut(bounded, err), "ended by its bound: %v", err)
	require.ErrorIs(t, err, tenant.ErrNewTokenLookupsFull, "told apart from a full pool")

	// The known token's refresh goes through meanwhile.
	refreshed, done := pgwait.Bound(ctx, 5*time.Second)
	defer done()
	got, err = auth.Authenticate(refreshed, known)
	require.NoError(t, err, "a known token's refresh is not held behind the new tokens' lookups")
	require.Equal(t, "acme", got.Name)

	hold.Release()
	select {
	case err := <-first:
		require.ErrorIs(t, err, tenant.ErrUnknownBearerToken)
	case <-ctx.Done():
		t.Fatal("the held lookup did not end")
	}
	// Its place is free again.
	again, done := pgwait.Bound(ctx, 5*time.Second)
	defer done()
	_, err = auth.Authenticate(again, madeUp())
	require.ErrorIs(t, err, tenant.ErrUnknownBearerToken)
}
