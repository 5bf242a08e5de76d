package operator_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/pgtest"
)

func TestStore_CreateAuthenticateRevoke(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	store := operator.NewStore(pool, nil)
	ctx := context.Background()

	o, token, err := store.Create(ctx, "alice")
	require.NoError(t, err)
	require.Equal(t, "alice", o.Name)
	require.True(t, strings.HasPrefix(token, operator.TokenPrefix))
	got, err := store.Authenticate(ctx, token)
	require.NoError(t, err)
	require.Equal(t, "alice", got.Name)

	// Only the hash is stored: the token appears nowhere in the table.
	var stored int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM operators o WHERE strpos(row_to_json(o)::text, $1) > 0`, token).Scan(&stored))
	require.Zero(t, stored)

	_, _, err = store.Create(ctx, "alice")
	require.ErrorIs(t, err, operator.ErrExists)
	for _, name := range []string{"", "-x", "a b", strings.Repeat("a", 65)} {
		_, _, err = store.Create(ctx, name)
		require.ErrorIs(t, err, operator.ErrInvalidName, "name %q", name)
	}
	// A tenant's token (prefix llmq_) is malformed here: refused without a lookup.
	_, err = store.Authenticate(ctx, "llmq_"+strings.Repeat("A", 43))
	require.ErrorIs(t, err, operator.ErrMalformedToken)
	_, err = store.Authenticate(ctx, operator.TokenPrefix+strings.Repeat("A", 43))
	require.ErrorIs(t, err, operator.ErrUnknownToken)

	// A session of alice ends with her revocation.
	sessionToken, sess, err := store.Login(ctx, token, time.Hour)
	require.NoError(t, err)
	require.Equal(t, "alice", sess.Operator)
	require.NotEmpty(t, sess.CSRF)
	_, err = store.Session(ctx, sessionToken)
	require.NoError(t, err)

	was, err := store.Revoke(ctx, "alice")
	require.NoError(t, err)
	require.True(t, was)
	_, err = store.Authenticate(ctx, token)
	require.ErrorIs(t, err, operator.ErrRevoked)
	_, err = store.Session(ctx, sessionToken)
	require.ErrorIs(t, err, operator.ErrNoSession)
	_, _, err = store.Login(ctx, token, time.Hour)
	require.ErrorIs(t, err, operator.ErrRevoked)
	var revoked *operator.RevokedError
	require.ErrorAs(t, err, &revoked, "it names the operator, for the console's log")
	require.Equal(t, "alice", revoked.Operator)
	was, err = store.Revoke(ctx, "alice")
	require.NoError(t, err)
	require.False(t, was)
	_, err = store.Revoke(ctx, "nobody")
	require.ErrorIs(t, err, operator.ErrNotFound)

	list, err := store.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.NotNil(t, list[0].RevokedAt)
}

func TestStore_Sessions(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	now := time.Now()
	clock := func() time.Time { return now }
	store := operator.NewStore(pool, &operator.StoreConfig{Now: func() time.Time { return clock() }})
	ctx := context.Background()
	_, token, err := store.Create(ctx, "bob")
	require.NoError(t, err)

	s1, sess1, err := store.Login(ctx, token, time.Hour)
	require.NoError(t, err)
	s2, sess2, err := store.Login(ctx, token, time.Hour)
	require.NoError(t, err)
	require.NotEqual(t, s1, s2)
	require.NotEqual(t, sess1.CSRF, sess2.CSRF)

	// Logout ends one session, not the other; unknown and malformed tokens are no session.
	require.NoError(t, store.Logout(ctx, s1))
	_, err = store.Session(ctx, s1)
	require.ErrorIs(t, err, operator.ErrNoSession)
	got, err := store.Session(ctx, s2)
	require.NoError(t, err)
	require.Equal(t, sess2.CSRF, got.CSRF)
	for _, bad := range []string{"", "x", s2 + "x", strings.Repeat("A", 43)} {
		_, err = store.Session(ctx, bad)
		require.ErrorIs(t, err, operator.ErrNoSession, "token %q", bad)
	}
	require.NoError(t, store.Logout(ctx, "garbage"))

	// A session expires.
	now = now.Add(time.Hour + time.Second)
	_, err = store.Session(ctx, s2)
	require.ErrorIs(t, err, operator.ErrNoSession)
}
