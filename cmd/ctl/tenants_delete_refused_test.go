package main

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redistest"
)

// TestTenants_DeleteRefusedDoesNotSayRunAgain: a deletion Postgres refuses before anything is
// changed, for a reason a second run meets again (here a role without the privileges: 42501
// permission denied), says nothing was changed but not to run the command again: it said "run
// `ctl tenants delete acme` again", as for an interruption or an outage, which pass.
func TestTenants_DeleteRefusedDoesNotSayRunAgain(t *testing.T) {
	t.Parallel()
	b, redis, store := revokedAcme(t)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	role := "llmq_test_role_" + redistest.Rand()
	_, err := b.pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { // after ctl's pool is closed (runApp returns with it closed)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, b.url)
		require.NoError(t, err)
		defer func() { _ = c.Close(context.Background()) }()
		_, err = c.Exec(ctx, "DROP ROLE "+role)
		require.NoError(t, err)
	})
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	u.User = url.User(role)

	r, expired := runApp(20*time.Second, func(a *app) { a.revokeSettle = 0 },
		append(append([]string{"--database-url", u.String()}, redis...), "tenants", "delete", "acme")...)
	require.False(t, expired)
	requireOneLineError(t, r, 1, "permission denied")
	require.Contains(t, r.errOut, "tenant acme not deleted (nothing was changed)")
	require.NotContains(t, r.errOut, "again", "a refusal that repeats is no reason to run the command again")
	_, err = store.Get(t.Context(), "acme")
	require.NoError(t, err)
}
