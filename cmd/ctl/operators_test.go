package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/operator"
)

func TestOperators_CreateListRevokeAudit(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url}
	ctx := context.Background()

	r := run(t, append(db, "operators", "list")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "no operators (ctl operators create NAME)\n", r.out)

	r = run(t, append(db, "operators", "create", "alice")...)
	require.Equal(t, 0, r.code, r.errOut)
	token := strings.TrimSuffix(r.out, "\n")
	require.True(t, strings.HasPrefix(token, operator.TokenPrefix), r.out)
	require.Contains(t, r.errOut, "not shown again")
	_, err := operator.NewStore(b.pool, nil).Authenticate(ctx, token)
	require.NoError(t, err)
	requireOneLineError(t, run(t, append(db, "operators", "create", "alice")...), 2, `operator exists: "alice"`)
	requireOneLineError(t, run(t, append(db, "operators", "create")...), 2, "usage: ctl operators create NAME")

	r = run(t, append(db, "operators", "list", "--json")...)
	require.Equal(t, 0, r.code, r.errOut)
	var list []operator.Operator
	require.NoError(t, json.Unmarshal([]byte(r.out), &list))
	require.Len(t, list, 1)
	require.NotContains(t, r.out, token)

	r = run(t, append(db, "operators", "revoke", "alice")...)
	require.Equal(t, "operator alice revoked\n", r.out)
	r = run(t, append(db, "operators", "revoke", "alice")...)
	require.Equal(t, "operator alice was revoked already\n", r.out)
	requireOneLineError(t, run(t, append(db, "operators", "revoke", "nobody")...), 1, `operator not found: "nobody"`)

	// Both changes are in the audit log, newest first.
	entries := auditLog(t, b.url)
	require.Len(t, entries, 2)
	require.Equal(t, "operator.revoke", entries[0].Action)
	require.Equal(t, "operator.create", entries[1].Action)
	require.Equal(t, "alice", entries[1].Target)
	require.True(t, strings.HasPrefix(entries[1].Operator, "ctl"))
	r = run(t, append(db, "audit")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.out, "operator.create")
	requireOneLineError(t, run(t, append(db, "audit", "--limit", "0")...), 2, "--limit must be at least 1")
}

// auditLog is `ctl audit --json` on the database at url: the audit log, newest first.
func auditLog(t *testing.T, url string) []audit.Entry {
	t.Helper()
	r := run(t, "--database-url", url, "audit", "--json")
	require.Equal(t, 0, r.code, r.errOut)
	var entries []audit.Entry
	require.NoError(t, json.Unmarshal([]byte(r.out), &entries))
	return entries
}
