package audit_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/pgtest"
)

func TestLog_List(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	e, err := audit.Log(ctx, pool, audit.Entry{Operator: "alice", Action: "dead.retry", Count: 3,
		Detail: map[string]any{"ids": []string{"a", "b", "c"}}})
	require.NoError(t, err)
	require.NotZero(t, e.ID)
	require.False(t, e.At.IsZero())
	_, err = audit.Log(ctx, pool, audit.Entry{Operator: "bob", Action: "tenant.create", Target: "acme", Count: 1})
	require.NoError(t, err)

	all, err := audit.List(ctx, pool, audit.ListParams{})
	require.NoError(t, err)
	require.Len(t, all, 2)
	require.Equal(t, "tenant.create", all[0].Action, "newest first")
	require.Equal(t, "acme", all[0].Target)
	require.Nil(t, all[0].Detail)
	require.Equal(t, 3, all[1].Count)
	require.Equal(t, []any{"a", "b", "c"}, all[1].Detail["ids"])

	alice, err := audit.List(ctx, pool, audit.ListParams{Operator: "alice", Limit: 10})
	require.NoError(t, err)
	require.Len(t, alice, 1)
	require.Equal(t, "alice", alice[0].Operator)
}
