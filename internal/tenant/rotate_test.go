package tenant_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

// rotationStore is a Store, and an Authenticator on a hand-set clock (for its cache only:
// overlaps are on Postgres's clock, see age).
func rotationStore(t *testing.T) (*tenant.Store, *tenant.Authenticator, *clocktest.Clock, *pgxpool.Pool) {
	t.Helper()
	pool := pgtest.Pool(t)
	clock := clocktest.New(time.Unix(1_700_000_000, 0))
	store := tenant.NewStore(pool, nil)
	return store, tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{TTL: 2 * time.Second, Now: clock.Now}), clock, pool
}

// age moves the tenant's rotations d into the past, as if d had passed on Postgres's clock.
func age(t *testing.T, pool *pgxpool.Pool, name string, d time.Duration) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `UPDATE tenant_previous_tokens
SET rotated_at = rotated_at - $2 * interval '1 microsecond', expires_at = expires_at - $2 * interval '1 microsecond'
WHERE tenant = $1`, name, d.Microseconds())
	require.NoError(t, err)
}

// pgNow is Postgres's now().
func pgNow(t *testing.T, pool *pgxpool.Pool) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT now()`).Scan(&now))
	return now
}

// TestStore_Rotate: the new token works at once, the old one for the overlap, then answers
// ErrRotatedOut (with its tenant) for ever.
func TestStore_Rotate(t *testing.T) {
	t.Parallel()
	store, _, _, pool := rotationStore(t)
	ctx := context.Background()
	_, old, err := store.CreateWeighted(ctx, "acme", []string{"a"}, 3)
	require.NoError(t, err)

	before := pgNow(t, pool)
	r, err := store.Rotate(ctx, "acme", time.Hour)
	require.NoError(t, err)
	after := pgNow(t, pool)
	require.NotEqual(t, old, r.Token)
	require.Equal(t, "acme", r.Tenant.Name)
	require.Equal(t, 3, r.Tenant.Weight)
	require.False(t, r.PreviousEnds.Before(before.Add(time.Hour)), "%s before %s", r.PreviousEnds, before.Add(time.Hour))
	require.False(t, r.PreviousEnds.After(after.Add(time.Hour)), "%s after %s", r.PreviousEnds, after.Add(time.Hour))
	require.Zero(t, r.Ended)

	for _, tok := range []string{old, r.Token} {
		got, err := store.Authenticate(ctx, tok)
		require.NoError(t, err)
		require.Equal(t, "acme", got.Name)
		require.Equal(t, []string{"a"}, got.Credentials)
	}
	age(t, pool, "acme", time.Hour-time.Minute)
	_, err = store.Authenticate(ctx, old)
	require.NoError(t, err)
	age(t, pool, "acme", time.Minute)
	got, err := store.Authenticate(ctx, old)
	require.ErrorIs(t, err, tenant.ErrRotatedOut)
	require.Equal(t, "acme", got.Name)
	age(t, pool, "acme", 365*24*time.Hour)
	_, err = store.Authenticate(ctx, old)
	require.ErrorIs(t, err, tenant.ErrRotatedOut)
	_, err = store.Authenticate(ctx, r.Token)
	require.NoError(t, err)

	// No overlap: the old token ends at once.
	r2, err := store.Rotate(ctx, "acme", 0)
	require.NoError(t, err)
	_, err = store.Authenticate(ctx, r.Token)
	require.ErrorIs(t, err, tenant.ErrRotatedOut)
	_, err = store.Authenticate(ctx, r2.Token)
	require.NoError(t, err)
}

// TestStore_RotateTwiceDuringOverlap: a second rotation ends the token still in the first one's
// overlap at once; the token it replaces gets the new overlap.
func TestStore_RotateTwiceDuringOverlap(t *testing.T) {
	t.Parallel()
	store, _, _, pool := rotationStore(t)
	ctx := context.Background()
	_, first, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	r1, err := store.Rotate(ctx, "acme", 24*time.Hour)
	require.NoError(t, err)
	age(t, pool, "acme", time.Minute)
	r2, err := store.Rotate(ctx, "acme", 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, 1, r2.Ended)

	_, err = store.Authenticate(ctx, first)
	require.ErrorIs(t, err, tenant.ErrRotatedOut)
	for _, tok := range []string{r1.Token, r2.Token} {
		_, err = store.Authenticate(ctx, tok)
		require.NoError(t, err)
	}
	// A third, later: only the one in overlap is ended (the first is not counted again).
	age(t, pool, "acme", 25*time.Hour)
	r3, err := store.Rotate(ctx, "acme", time.Hour)
	require.NoError(t, err)
	require.Equal(t, 0, r3.Ended)
	_, err = store.Authenticate(ctx, r2.Token)
	require.NoError(t, err)
	_, err = store.Authenticate(ctx, r1.Token)
	require.ErrorIs(t, err, tenant.ErrRotatedOut)
}

// TestStore_RevokeDuringOverlap: a revocation ends both tokens (ErrRevoked, not ErrRotatedOut,
// also past the overlap), and a revoked tenant is refused a rotation.
func TestStore_RevokeDuringOverlap(t *testing.T) {
	t.Parallel()
	store, _, _, pool := rotationStore(t)
	ctx := context.Background()
	_, old, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	r, err := store.Rotate(ctx, "acme", time.Hour)
	require.NoError(t, err)
	_, err = store.Revoke(ctx, "acme")
	require.NoError(t, err)
	for _, tok := range []string{old, r.Token} {
		got, err := store.Authenticate(ctx, tok)
		require.ErrorIs(t, err, tenant.ErrRevoked)
		require.Equal(t, "acme", got.Name)
	}
	age(t, pool, "acme", 2*time.Hour)
	_, err = store.Authenticate(ctx, old)
	require.ErrorIs(t, err, tenant.ErrRevoked)

	_, err = store.Rotate(ctx, "acme", time.Hour)
	require.ErrorIs(t, err, tenant.ErrRevoked)
	require.ErrorContains(t, err, `"acme" gets no new token`)
	_, err = store.Authenticate(ctx, r.Token)
	require.ErrorIs(t, err, tenant.ErrRevoked) // unchanged
}

// TestStore_RotateRefusals: unknown tenants, names no tenant can have, overlaps out of range.
func TestStore_RotateRefusals(t *testing.T) {
	t.Parallel()
	store, _, _, _ := rotationStore(t)
	ctx := context.Background()
	_, token, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	for _, name := range []string{"nobody", "no/slash", "bad\x00name", ""} {
		_, err := store.Rotate(ctx, name, time.Hour)
		require.ErrorIs(t, err, tenant.ErrNotFound, "name %q", name)
	}
	for _, d := range []time.Duration{-time.Second, tenant.MaxOverlap + time.Second} {
		_, err := store.Rotate(ctx, "acme", d)
		require.ErrorIs(t, err, tenant.ErrInvalidOverlap, "overlap %s", d)
	}
	_, err = store.Rotate(ctx, "acme", tenant.MaxOverlap)
	require.NoError(t, err)
	_, err = store.Authenticate(ctx, token)
	require.NoError(t, err)
}

// TestAuthenticator_RotatedTokenEndsWithItsOverlap: a cached answer for a token in its overlap
// is not reused past the overlap's end (what was left of it when Postgres answered, on this
// process's clock), whatever the TTL; the current token's cached answer (cached before a
// rotation without overlap) lives at most the TTL.
func TestAuthenticator_RotatedTokenEndsWithItsOverlap(t *testing.T) {
	t.Parallel()
	store, _, clock, pool := rotationStore(t)
	const ttl = 10 * time.Minute // longer than what is left of the overlap below, however slow the machine
	auth := tenant.NewAuthenticator(store, &tenant.AuthenticatorConfig{TTL: ttl, Now: clock.Now})
	ctx := context.Background()
	_, old, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	r, err := store.Rotate(ctx, "acme", time.Hour)
	require.NoError(t, err)
	age(t, pool, "acme", time.Hour-time.Minute) // at most a minute of overlap left
	_, err = auth.Authenticate(ctx, old)        // cached for at most that minute, not the TTL
	require.NoError(t, err)
	age(t, pool, "acme", time.Hour) // ended in Postgres; the cache does not know it yet
	_, err = auth.Authenticate(ctx, old)
	require.NoError(t, err, "the cached answer, within what was left of the overlap")
	clock.Advance(time.Minute)
	got, err := auth.Authenticate(ctx, old)
	require.ErrorIs(t, err, tenant.ErrRotatedOut)
	require.Equal(t, "acme", got.Name)

	_, err = auth.Authenticate(ctx, r.Token)
	require.NoError(t, err)
	_, err = store.Rotate(ctx, "acme", 0)
	require.NoError(t, err)
	clock.Advance(ttl - time.Millisecond)
	_, err = auth.Authenticate(ctx, r.Token) // the cached answer, within the TTL
	require.NoError(t, err)
	clock.Advance(time.Millisecond)
	_, err = auth.Authenticate(ctx, r.Token)
	require.ErrorIs(t, err, tenant.ErrRotatedOut)
}

// TestStore_ListShowsOverlap: List says when a tenant's replaced token ends while its overlap
// lasts (a rotation in progress), and nothing once it has ended or with no overlap.
func TestStore_ListShowsOverlap(t *testing.T) {
	t.Parallel()
	store, _, _, pool := rotationStore(t)
	ctx := context.Background()
	for _, name := range []string{"acme", "other"} {
		_, _, err := store.Create(ctx, name, nil)
		require.NoError(t, err)
	}
	r, err := store.Rotate(ctx, "acme", time.Hour)
	require.NoError(t, err)
	_, err = store.Rotate(ctx, "other", 0)
	require.NoError(t, err)
	list, err := store.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.NotNil(t, list[0].PreviousTokenEndsAt, "acme is in its overlap")
	require.True(t, r.PreviousEnds.Equal(*list[0].PreviousTokenEndsAt), "%s, want %s", list[0].PreviousTokenEndsAt, r.PreviousEnds)
	require.Nil(t, list[1].PreviousTokenEndsAt, "other's rotation had no overlap")

	age(t, pool, "acme", time.Hour)
	list, err = store.List(ctx)
	require.NoError(t, err)
	require.Nil(t, list[0].PreviousTokenEndsAt, "acme's overlap has ended")
}
