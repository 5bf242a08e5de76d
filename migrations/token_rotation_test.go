package migrations_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMigration021_KeepsTenantsAndHoldsRotations upgrades a database of the last release (020)
// holding a tenant: its token is untouched, and the new table takes a rotated-out token of a
// known tenant only, once per hash, its overlap not ending before the rotation. Its down drops
// the table and leaves the tenant as it was.
func TestMigration021_KeepsTenantsAndHoldsRotations(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, _, conn := migrated(ctx, t)
	rollBack(ctx, t, conn, 20)
	token := sha256.Sum256([]byte("llmq_current"))
	_, err := conn.Exec(ctx, `INSERT INTO tenants (name, token_sha256) VALUES ('acme', $1)`, token[:])
	require.NoError(t, err)

	migrateUp(ctx, t, dbURL)
	var stored []byte
	require.NoError(t, conn.QueryRow(ctx, `SELECT token_sha256 FROM tenants WHERE name = 'acme'`).Scan(&stored))
	require.Equal(t, token[:], stored)

	old := sha256.Sum256([]byte("llmq_old"))
	now := time.Now()
	insert := `INSERT INTO tenant_previous_tokens (token_sha256, tenant, rotated_at, expires_at) VALUES ($1, $2, $3, $4)`
	_, err = conn.Exec(ctx, insert, old[:], "acme", now, now.Add(time.Hour))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, insert, old[:], "acme", now, now)
	require.ErrorContains(t, err, "tenant_previous_tokens_pkey")
	other := sha256.Sum256([]byte("llmq_other"))
	_, err = conn.Exec(ctx, insert, other[:], "nobody", now, now)
	require.ErrorContains(t, err, "foreign key")
	_, err = conn.Exec(ctx, insert, other[:], "acme", now, now.Add(-time.Second))
	require.ErrorContains(t, err, "check constraint")
	_, err = conn.Exec(ctx, insert, []byte("short"), "acme", now, now)
	require.ErrorContains(t, err, "check constraint")

	rollBack(ctx, t, conn, 20)
	var exists bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT to_regclass('tenant_previous_tokens') IS NOT NULL`).Scan(&exists))
	require.False(t, exists)
	require.NoError(t, conn.QueryRow(ctx, `SELECT token_sha256 FROM tenants WHERE name = 'acme'`).Scan(&stored))
	require.Equal(t, token[:], stored)
}
