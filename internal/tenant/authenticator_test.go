package tenant_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

func TestAuthenticator_CachesForTTL(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	auth := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{TTL: 2 * time.Second, Now: clock.Now})
	require.Equal(t, 2*time.Second, auth.TTL())
	_, token, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)

	got, err := auth.Authenticate(ctx, token)
	require.NoError(t, err)
	require.Equal(t, "acme", got.Name)

	// A revocation is not seen while the answer is cached...
	_, err = store.Revoke(ctx, "acme")
	require.NoError(t, err)
	clock.Advance(1999 * time.Millisecond)
	_, err = auth.Authenticate(ctx, token)
	require.NoError(t, err)
	// ...and is once the TTL has passed.
	clock.Advance(time.Millisecond)
	got, err = auth.Authenticate(ctx, token)
	require.ErrorIs(t, err, tenant.ErrRevoked)
	require.Equal(t, "acme", got.Name)

	// Malformed tokens never reach the database; unknown ones are answered from the cache too.
	_, err = auth.Authenticate(ctx, "nope")
	require.ErrorIs(t, err, tenant.ErrMalformedBearerToken)
	_, unknown, err := tenant.NewStore(pgtest.Pool(t), nil).Create(ctx, "elsewhere", nil)
	require.NoError(t, err)
	_, err = auth.Authenticate(ctx, unknown)
	require.ErrorIs(t, err, tenant.ErrUnknownBearerToken)
}

func TestAuthenticator_DatabaseErrorsAreNotCached(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	auth := tenant.NewAuthenticator(store, nil)
	_, token, err := store.Create(context.Background(), "acme", nil)
	require.NoError(t, err)

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = auth.Authenticate(canceled, token)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, tenant.ErrUnknownBearerToken)

	got, err := auth.Authenticate(context.Background(), token)
	require.NoError(t, err)
	require.Equal(t, "acme", got.Name)
}

func TestAuthenticator_BoundedCache(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	auth := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{TTL: time.Minute, MaxEntries: 2, Now: clock.Now})
	_, token, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	_, err = auth.Authenticate(ctx, token)
	require.NoError(t, err)
	_, err = store.Revoke(ctx, "acme")
	require.NoError(t, err)

	// Two more known tokens fill the cache and clear it, so acme's answer is read again, early.
	// (Unknown tokens fill a cache of their own: TestAuthenticator_UnknownTokensDoNotEvictKnownOnes.)
	for _, n := range []string{"x", "y"} {
		_, tok, err := store.Create(ctx, n, nil)
		require.NoError(t, err)
		_, err = auth.Authenticate(ctx, tok)
		require.NoError(t, err)
	}
	_, err = auth.Authenticate(ctx, token)
	require.ErrorIs(t, err, tenant.ErrRevoked)
}

func TestAuthenticator_Named(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	auth := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{TTL: 2 * time.Second, Now: clock.Now})

	// No stored tenant: one of that name, unrestricted, of the default weight.
	got, err := auth.Named(ctx, tenant.Default)
	require.NoError(t, err)
	require.Equal(t, &tenant.Tenant{Name: tenant.Default, Weight: tenant.DefaultWeight}, got)

	// A tenant stored since is seen once the TTL has passed, with its restriction and weight.
	_, _, err = store.CreateWeighted(ctx, tenant.Default, []string{"cheap"}, 3)
	require.NoError(t, err)
	got, err = auth.Named(ctx, tenant.Default)
	require.NoError(t, err)
	require.Nil(t, got.Credentials)
	clock.Advance(2 * time.Second)
	got, err = auth.Named(ctx, tenant.Default)
	require.NoError(t, err)
	require.Equal(t, []string{"cheap"}, got.Credentials)
	require.Equal(t, 3, got.Weight)

	_, err = store.Revoke(ctx, tenant.Default)
	require.NoError(t, err)
	clock.Advance(2 * time.Second)
	got, err = auth.Named(ctx, tenant.Default)
	require.ErrorIs(t, err, tenant.ErrRevoked)
	require.Equal(t, tenant.Default, got.Name)

	// Database errors are not cached.
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = auth.Named(canceled, "other")
	require.ErrorIs(t, err, context.Canceled)
	got, err = auth.Named(ctx, "other")
	require.NoError(t, err)
	require.Equal(t, "other", got.Name)
}

// TestAuthenticator_UnknownTokensDoNotEvictKnownOnes: answers for unknown tokens are capped
// apart, so a flood of random well-formed tokens (anyone can send them, no token needed) cannot
// clear the cached answers of real tenants' tokens and make each of their requests look up again.
func TestAuthenticator_UnknownTokensDoNotEvictKnownOnes(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	auth := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{TTL: time.Minute, MaxEntries: 2, Now: clock.Now})
	_, token, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	_, err = auth.Authenticate(ctx, token)
	require.NoError(t, err)
	// Revoked now: an answer read again (rather than the cached one) says so.
	_, err = store.Revoke(ctx, "acme")
	require.NoError(t, err)

	other := tenant.NewStore(pgtest.Pool(t), nil)
	var unknown []string
	for i := range 5 {
		_, tok, err := other.Create(ctx, fmt.Sprintf("t%d", i), nil)
		require.NoError(t, err)
		unknown = append(unknown, tok)
		_, err = auth.Authenticate(ctx, tok)
		require.ErrorIs(t, err, tenant.ErrUnknownBearerToken)
	}
	_, err = auth.Authenticate(ctx, token)
	require.NoError(t, err, "acme's cached answer was evicted by unknown tokens")
	// The unknown answers are cached too, within their own cap (the last one is).
	require.Equal(t, 2, auth.CachedTokens())
	_, err = auth.Authenticate(ctx, unknown[len(unknown)-1])
	require.ErrorIs(t, err, tenant.ErrUnknownBearerToken)
}

// TestAuthenticator_CachedAnswersAsAuthenticate: Cached and CachedNamed answer what
// Authenticate and Named answer, on the same clock, while that answer is cached (a tenant, an
// unknown token, a revocation seen, a replaced token in its overlap), and ErrNotCached when
// those would look up: before the first lookup, once the TTL has passed (a revocation is not
// seen sooner nor later), at the end of a replaced token's overlap. A malformed token needs no
// lookup. Nothing is cached by Cached itself.
func TestAuthenticator_CachedAnswersAsAuthenticate(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	ctx := context.Background()
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	auth := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{TTL: 2 * time.Second, Now: clock.Now})
	_, acme, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	_, bolt, err := store.Create(ctx, "bolt", nil)
	require.NoError(t, err)
	_, unknown, err := tenant.NewStore(pgtest.Pool(t), nil).Create(ctx, "elsewhere", nil)
	require.NoError(t, err)
	// cachedAsLookedUp requires Cached's answer for token to be Authenticate's.
	cachedAsLookedUp := func(token, name string, want error) {
		t.Helper()
		got, err := auth.Cached(token)
		require.ErrorIs(t, err, want)
		looked, lerr := auth.Authenticate(ctx, token)
		require.ErrorIs(t, lerr, want)
		if name == "" {
			require.Nil(t, got)
			require.Nil(t, looked)
			return
		}
		require.Equal(t, name, got.Name)
		require.Same(t, looked, got)
	}
	notCached := func(token string) {
		t.Helper()
		got, err := auth.Cached(token)
		require.ErrorIs(t, err, tenant.ErrNotCached)
		require.Nil(t, got)
	}

	_, err = auth.Cached("nope")
	require.ErrorIs(t, err, tenant.ErrMalformedBearerToken)
	notCached(acme)
	notCached(acme) // Cached looked nothing up
	_, err = auth.Authenticate(ctx, acme)
	require.NoError(t, err)
	cachedAsLookedUp(acme, "acme", nil)
	notCached(unknown)
	_, err = auth.Authenticate(ctx, unknown)
	require.ErrorIs(t, err, tenant.ErrUnknownBearerToken)
	cachedAsLookedUp(unknown, "", tenant.ErrUnknownBearerToken)

	// A revocation: not seen while the answer is cached, by either; seen by both after the TTL.
	_, err = store.Revoke(ctx, "acme")
	require.NoError(t, err)
	clock.Advance(1999 * time.Millisecond)
	cachedAsLookedUp(acme, "acme", nil)
	clock.Advance(time.Millisecond)
	notCached(acme)
	_, err = auth.Authenticate(ctx, acme)
	require.ErrorIs(t, err, tenant.ErrRevoked)
	cachedAsLookedUp(acme, "acme", tenant.ErrRevoked)

	// A replaced token is cached no longer than its overlap, shorter than the TTL: here an
	// authenticator of its own, its TTL an hour and the overlap a minute. The overlap runs in
	// real time (Postgres's clock) from the rotation to the lookup, which a loaded run can
	// stretch past a second.
	overlapped := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{TTL: time.Hour, Now: clock.Now})
	_, err = store.Rotate(ctx, "bolt", time.Minute)
	require.NoError(t, err)
	looked, err := overlapped.Authenticate(ctx, bolt)
	require.NoError(t, err)
	cached, err := overlapped.Cached(bolt)
	require.NoError(t, err)
	require.Same(t, looked, cached)
	clock.Advance(time.Minute)
	_, err = overlapped.Cached(bolt)
	require.ErrorIs(t, err, tenant.ErrNotCached)

	// The anonymous tenant's answer, by name.
	_, err = auth.CachedNamed(tenant.Default)
	require.ErrorIs(t, err, tenant.ErrNotCached)
	named, err := auth.Named(ctx, tenant.Default)
	require.NoError(t, err)
	got, err := auth.CachedNamed(tenant.Default)
	require.NoError(t, err)
	require.Same(t, named, got)
	clock.Advance(2 * time.Second)
	_, err = auth.CachedNamed(tenant.Default)
	require.ErrorIs(t, err, tenant.ErrNotCached)
}
