package console_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/tenant"
)

// TestTenants_RevokeAuditedAsCtl: a revoke that changed nothing (the tenant was revoked already:
// a second click, a stale page) is not audited, as `ctl tenants revoke` does not audit it; the
// console logged a second tenant.revoke of count 0, so the two audit trails of one action
// differed.
func TestTenants_RevokeAuditedAsCtl(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	_, _, err := tenant.NewStore(b.jobs.Pool, nil).Create(context.Background(), "acme", nil)
	require.NoError(t, err)
	var rev struct {
		Changed bool `json:"changed"`
	}
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", nil, &rev)
	require.True(t, rev.Changed)
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", nil, &rev)
	require.False(t, rev.Changed)
	var actions []string
	for _, e := range b.audit(t) {
		actions = append(actions, fmt.Sprintf("%s %s %d", e.Action, e.Target, e.Count))
	}
	require.Equal(t, []string{"tenant.revoke acme 1", "login  1"}, actions)
}

// TestTenants_RevokeCancelJobs: the console's revoke with {"cancel_jobs": true} cancels every
// job of the tenant that has not ended, as `ctl tenants revoke --cancel-jobs` does, and none of
// its ended jobs nor another tenant's; on a tenant revoked already it cancels all the same. The
// revocation and the cancels are audited as ctl audits them. A body that is not the action's is
// a 400 naming the problem, and revokes nothing.
func TestTenants_RevokeCancelJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.login(t)
	ctx := context.Background()
	store := tenant.NewStore(b.jobs.Pool, nil)
	for _, name := range []string{"acme", "other"} {
		_, _, err := store.Create(ctx, name, nil)
		require.NoError(t, err)
	}
	queued := b.jobs.Create(t, jobstest.Opts{Tenant: "acme"})
	running := b.jobs.Create(t, jobstest.Opts{Tenant: "acme", Credential: "backup"})
	_, err := b.jobs.Store.BeginAttempt(ctx, running.ID)
	require.NoError(t, err)
	done := b.jobs.Create(t, jobstest.Opts{Tenant: "acme"})
	b.jobs.Attempt(t, done.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	other := b.jobs.Create(t, jobstest.Opts{Tenant: "other"})

	r, out := c.do(http.MethodPost, "/console/api/tenants/acme/revoke", map[string]any{"cancel_jobs": "yes"}, nil)
	requireError(t, r, out, http.StatusBadRequest, "invalid_body")
	r, out = c.do(http.MethodPost, "/console/api/tenants/acme/revoke", map[string]any{"cancel": true}, nil)
	requireError(t, r, out, http.StatusBadRequest, "invalid_body")
	tn, err := store.Get(ctx, "acme")
	require.NoError(t, err)
	require.False(t, tn.Revoked(), "a refused request revokes nothing")

	type answer struct {
		Message  string `json:"message"`
		Changed  bool   `json:"changed"`
		Canceled int    `json:"canceled"`
	}
	var res answer
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", map[string]any{"cancel_jobs": true}, &res)
	require.Equal(t, answer{Message: "tenant acme revoked; canceled 2 jobs of it", Changed: true, Canceled: 2}, res)
	for j, want := range map[*jobs.Job]jobs.Status{queued: jobs.StatusCanceled, running: jobs.StatusCanceled,
		done: jobs.StatusSucceeded, other: jobs.StatusQueued} {
		got, err := b.jobs.Store.Get(ctx, j.ID)
		require.NoError(t, err)
		require.Equal(t, want, got.Status, "job %s of %s", j.ID, j.Tenant)
	}
	b.mu.Lock()
	require.ElementsMatch(t, []string{"default", "backup"}, b.canceled, "counted as the console's cancels")
	b.mu.Unlock()

	// Revoked already: a job accepted since is canceled all the same; nothing left, nothing done.
	late := b.jobs.Create(t, jobstest.Opts{Tenant: "acme"})
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", map[string]any{"cancel_jobs": true}, &res)
	require.Equal(t, answer{Message: "tenant acme was revoked already; canceled 1 jobs of it", Changed: true, Canceled: 1}, res)
	got, err := b.jobs.Store.Get(ctx, late.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	var plain answer
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", map[string]any{"cancel_jobs": false}, &plain)
	require.Equal(t, answer{Message: "tenant acme was revoked already"}, plain)
	r, out = c.do(http.MethodPost, "/console/api/tenants/nobody/revoke", map[string]any{"cancel_jobs": true}, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")

	var actions []string
	for _, e := range b.audit(t) {
		actions = append(actions, fmt.Sprintf("%s %s %d", e.Action, e.Target, e.Count))
	}
	require.Equal(t, []string{"tenant.cancel_jobs acme 1", "tenant.cancel_jobs acme 2", "tenant.revoke acme 1", "login  1"}, actions)
}
