package maintenance_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/maintenance"
	"github.com/llmq/llmq/internal/tenant"
)

// TestMaintainer_DeletesRotatedOutTokens: the retention pass deletes the rotated-out tokens
// (tenant_previous_tokens) whose overlap ended longer ago than the audit log is kept
// (AuditRetention, which keeps the rotation's entry as long), and keeps the others: a client
// still sending one of those hears "rotated out", one of the deleted "unknown". They were kept for
// ever, a row per rotation.
func TestMaintainer_DeletesRotatedOutTokens(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	b, m := setup(t, maintenance.Config{Interval: 20 * time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		RetentionBatch: 1, BatchPause: time.Millisecond, AuditRetention: 365 * day})
	ctx := t.Context()
	store := tenant.NewStore(b.Pool, nil)
	// Given a tenant rotated three times: its first two tokens rotated out 400 days ago (more
	// than a batch), its third 364 days ago, its fourth current,
	_, first, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	tokens := []string{first}
	for range 3 {
		r, err := store.Rotate(ctx, "acme", 0)
		require.NoError(t, err)
		tokens = append(tokens, r.Token)
	}
	endedAgo := func(token string, ago time.Duration) {
		t.Helper()
		hash, err := tenant.HashBearerToken(token)
		require.NoError(t, err)
		tag, err := b.Pool.Exec(ctx, `UPDATE tenant_previous_tokens
SET rotated_at = now() - make_interval(secs => $2::bigint), expires_at = now() - make_interval(secs => $2::bigint)
WHERE token_sha256 = $1`, hash[:], int64(ago/time.Second))
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
	}
	endedAgo(tokens[0], 400*day)
	endedAgo(tokens[1], 400*day)
	endedAgo(tokens[2], 364*day)
	lookup := func(token string) error {
		hash, err := tenant.HashBearerToken(token)
		require.NoError(t, err)
		_, err = store.Lookup(ctx, hash)
		return err
	}
	rows := func() (int, error) {
		var n int
		err := b.Pool.QueryRow(ctx, `SELECT count(*) FROM tenant_previous_tokens`).Scan(&n)
		return n, err
	}
	n, err := rows()
	require.NoError(t, err)
	require.Equal(t, 3, n)

	// when the leader's retention pass runs,
	stop := runLeading(t, m)
	require.Eventually(t, func() bool { // on testify's goroutine: no require here
		n, err := rows()
		return err == nil && n == 1
	}, 30*time.Second, 20*time.Millisecond, "rotated-out tokens past the retention kept")
	stop()

	// the two past the retention are unknown tokens now, the other is still rotated out,
	require.ErrorIs(t, lookup(tokens[0]), tenant.ErrUnknownBearerToken)
	require.ErrorIs(t, lookup(tokens[1]), tenant.ErrUnknownBearerToken)
	require.ErrorIs(t, lookup(tokens[2]), tenant.ErrRotatedOut)
	require.NoError(t, lookup(tokens[3]))
	// and they are counted.
	require.InDelta(t, 2, metric(t, b.reg, "llmq_retention_deleted_previous_tokens_total", nil), 0)
}
