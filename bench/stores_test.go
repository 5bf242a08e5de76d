package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
)

// A run's cleanup takes its credential out of the workers' credential index, and only where the
// name still points at the run's tag: another run's entry stays, and the hash goes with its last
// field.
func TestUnindexCredential(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb := redistest.Client(t)
	key := redisscript.CredentialIndexKey(redistest.Prefix(t))
	mine, theirs := redisscript.CredentialTag("run-a"), redisscript.CredentialTag("run-b")
	require.NoError(t, rdb.HSet(ctx, key, "default", mine, "backup", theirs).Err())

	unindexCredential(ctx, rdb, key, mine)
	got, err := rdb.HGetAll(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"backup": theirs}, got, "the other run's entry stays")

	unindexCredential(ctx, rdb, key, theirs)
	n, err := rdb.Exists(ctx, key).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the hash is gone with its last field")
}
