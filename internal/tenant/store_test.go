package tenant_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

func TestStore_CreateAuthenticateRevoke(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	ctx := context.Background()

	created, token, err := store.Create(ctx, "acme", []string{"default", "oai"})
	require.NoError(t, err)
	require.Equal(t, "acme", created.Name)
	require.Equal(t, []string{"default", "oai"}, created.Credentials)
	require.False(t, created.Revoked())
	require.True(t, strings.HasPrefix(token, tenant.BearerTokenPrefix), token)
	require.Len(t, token, 48)

	t.Run("OnlyTheHashIsStored", func(t *testing.T) {
		t.Parallel()
		var stored []byte
		require.NoError(t, pool.QueryRow(ctx, `SELECT token_sha256 FROM tenants WHERE name = 'acme'`).Scan(&stored))
		sum := sha256.Sum256([]byte(token))
		require.Equal(t, sum[:], stored)
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM tenants WHERE row_to_json(tenants)::text LIKE '%' || $1 || '%'`,
			strings.TrimPrefix(token, tenant.BearerTokenPrefix)).Scan(&n))
		require.Zero(t, n)
	})

	got, err := store.Authenticate(ctx, token)
	require.NoError(t, err)
	require.Equal(t, "acme", got.Name)
	require.True(t, got.Allows("oai"))
	require.False(t, got.Allows("backup"))

	_, err = store.Authenticate(ctx, token[:len(token)-1]+flip(token[len(token)-1]))
	require.ErrorIs(t, err, tenant.ErrUnknownBearerToken)
	for _, bad := range []string{"", "llmq_", "Bearer " + token, token + "x", "sk-" + token[5:], strings.Replace(token, token[10:11], "+", 1)} {
		_, err = store.Authenticate(ctx, bad)
		require.ErrorIs(t, err, tenant.ErrMalformedBearerToken, "token %q", bad)
	}

	wasActive, err := store.Revoke(ctx, "acme")
	require.NoError(t, err)
	require.True(t, wasActive)
	got, err = store.Authenticate(ctx, token)
	require.ErrorIs(t, err, tenant.ErrRevoked)
	require.Equal(t, "acme", got.Name)
	wasActive, err = store.Revoke(ctx, "acme")
	require.NoError(t, err)
	require.False(t, wasActive)
	_, err = store.Revoke(ctx, "nobody")
	require.ErrorIs(t, err, tenant.ErrNotFound)

	stored, err := store.Get(ctx, "acme")
	require.NoError(t, err)
	require.Equal(t, "acme", stored.Name)
	require.True(t, stored.Revoked())
	for _, name := range []string{"nobody", "a\x00"} {
		_, err = store.Get(ctx, name)
		require.ErrorIs(t, err, tenant.ErrNotFound, name)
	}
}

func TestStore_Create(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := tenant.NewStore(pool, nil)
	ctx := context.Background()

	t.Run("AllCredentialsWhenNil", func(t *testing.T) {
		t.Parallel()
		tn, _, err := store.Create(ctx, "open", nil)
		require.NoError(t, err)
		require.Nil(t, tn.Credentials)
		require.True(t, tn.Allows("anything"))
	})
	t.Run("NameTaken", func(t *testing.T) {
		t.Parallel()
		_, _, err := store.Create(ctx, "twice", nil)
		require.NoError(t, err)
		_, _, err = store.Create(ctx, "twice", nil)
		require.ErrorIs(t, err, tenant.ErrExists)
	})
	t.Run("InvalidNames", func(t *testing.T) {
		t.Parallel()
		for _, name := range []string{"", "-x", "a b", "a/b", strings.Repeat("a", 65), "ünï", "a\x00"} {
			_, _, err := store.Create(ctx, name, nil)
			require.ErrorIs(t, err, tenant.ErrInvalidName, "name %q", name)
		}
		_, _, err := store.Create(ctx, "ok", []string{"fine", "not fine"})
		require.ErrorIs(t, err, tenant.ErrInvalidName)
		_, _, err = store.Create(ctx, "ok", []string{"a", "a"})
		require.ErrorContains(t, err, "twice")
	})
	t.Run("TokensFromTheRandomSource", func(t *testing.T) {
		t.Parallel()
		random := bytes.Repeat([]byte{0xfb}, 32)
		s := tenant.NewStore(pool, &tenant.StoreConfig{Random: bytes.NewReader(random)})
		_, token, err := s.Create(ctx, "predictable", nil)
		require.NoError(t, err)
		require.Equal(t, "llmq_"+base64.RawURLEncoding.EncodeToString(random), token)
		require.Contains(t, token, "-", "the URL-safe alphabet")
		_, _, err = s.Create(ctx, "exhausted", nil)
		require.ErrorContains(t, err, "read random token")
	})
}

func TestStore_List(t *testing.T) {
	t.Parallel()
	store := tenant.NewStore(pgtest.Pool(t), nil)
	ctx := context.Background()
	for _, n := range []string{"b", "a", "c"} {
		_, _, err := store.Create(ctx, n, nil)
		require.NoError(t, err)
	}
	_, err := store.Revoke(ctx, "c")
	require.NoError(t, err)

	list, err := store.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3)
	require.Equal(t, []string{"a", "b", "c"}, []string{list[0].Name, list[1].Name, list[2].Name})
	require.False(t, list[0].Revoked())
	require.True(t, list[2].Revoked())
}

func flip(c byte) string {
	if c == 'A' {
		return "B"
	}
	return "A"
}
