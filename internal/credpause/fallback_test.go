package credpause_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/credpause"
)

// TestStore_PauseInRedisWhenPostgresUsedTheBound: a spend cap's pause whose Postgres side waits
// out the caller's bound (another process holds the credential's pause lock; a slow or silent
// server alike) still pauses the credential in Redis, which is what stops the sends: the Redis
// fallback ran on the caller's context, ended by then, and the credential was paused nowhere (every
// job on it went on paying against a spend cap until the next one's answer).
func TestStore_PauseInRedisWhenPostgresUsedTheBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	other, err := pgxpool.New(ctx, b.pool.Config().ConnString()) // another process's, on the same database
	require.NoError(t, err)
	t.Cleanup(other.Close)
	holder, err := other.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	const lockClass = 0x6c717073 // credpause's
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockClass, b.gate.Tag())
	require.NoError(t, err)
	defer func() {
		_, err := holder.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, lockClass, b.gate.Tag())
		require.NoError(t, err)
	}()

	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	started, err := b.store.Pause(pctx, b.gate, "rate_limited_no_retry_after", "job-1")
	require.Error(t, err, "the pause's row was not written")
	require.True(t, errors.Is(err, credpause.ErrDatabase), "only Postgres failed: %v", err)
	require.True(t, started, "the pause began in Redis")

	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	ps, err := b.gate.Paused(rctx)
	require.NoError(t, err)
	require.True(t, ps.Paused, "the credential is paused in Redis")
}
