package console_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/pgtest"
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

// TestTenants_Delete: the console deletes a revoked tenant as `ctl tenants delete` does: it
// refuses a tenant not revoked (409 tenant_not_revoked), the anonymous requests' tenant and an
// unknown one, and a request without the session's CSRF token; on a revoked tenant it cancels the
// jobs that have not ended, deletes every job of it, keeps the tenant while a job in a provider
// batch still open is left (409 tenant_has_jobs), and deletes it once that batch ended. Another
// tenant's jobs are untouched; the audit trail is ctl's. The console had no deletion: an
// operator offboarding a tenant had to reach for ctl.
func TestTenants_Delete(t *testing.T) {
	t.Parallel()
	b := setupConfig(t, func(cfg *console.Config) { cfg.RevokeSettle = -1 }) // no replica caches it here
	c := b.login(t)
	ctx := context.Background()
	store := tenant.NewStore(b.jobs.Pool, nil)
	for _, name := range []string{"acme", "other"} {
		_, _, err := store.Create(ctx, name, nil)
		require.NoError(t, err)
	}
	queued := b.jobs.Create(t, jobstest.Opts{Tenant: "acme"})
	done := b.jobs.Create(t, jobstest.Opts{Tenant: "acme"})
	b.jobs.Attempt(t, done.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	inBatch := b.jobs.Create(t, jobstest.Opts{Tenant: "acme"})
	const batchID = "00000000-0000-4000-8000-0000000000b1"
	_, err := b.jobs.Pool.Exec(ctx, `INSERT INTO provider_batches (id, credential, model, state, provider_batch_id)
VALUES ($1, 'default', 'm', 'submitted', 'pb_1')`, batchID)
	require.NoError(t, err)
	_, err = b.jobs.Store.Cancel(ctx, inBatch.ID)
	require.NoError(t, err)
	_, err = b.jobs.Pool.Exec(ctx, `UPDATE jobs SET batch_ref = $2 WHERE id = $1`, inBatch.ID, batchID)
	require.NoError(t, err)
	other := b.jobs.Create(t, jobstest.Opts{Tenant: "other"})

	r, out := c.do(http.MethodPost, "/console/api/tenants/acme/delete", nil, nil)
	requireError(t, r, out, http.StatusConflict, "tenant_not_revoked")
	r, out = c.do(http.MethodPost, "/console/api/tenants/default/delete", nil, nil)
	requireError(t, r, out, http.StatusConflict, "anonymous_tenant")
	r, out = c.do(http.MethodPost, "/console/api/tenants/nobody/delete", nil, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", nil, &struct{}{})
	r, out = c.do(http.MethodPost, "/console/api/tenants/acme/delete", nil, http.Header{"X-Csrf-Token": {"wrong"}})
	require.Equal(t, http.StatusForbidden, r.StatusCode, out)
	got, err := b.jobs.Store.Get(ctx, queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status, "a refusal changes nothing")

	r, out = c.do(http.MethodPost, "/console/api/tenants/acme/delete", nil, nil)
	requireError(t, r, out, http.StatusConflict, "tenant_has_jobs")
	require.Contains(t, out, "canceled 1 and deleted 2 jobs of tenant acme, which is kept: 1 of its jobs are left (0 not ended, 1 in a provider batch")
	_, err = store.Get(ctx, "acme")
	require.NoError(t, err, "kept while a job is left")
	b.mu.Lock()
	require.Equal(t, []string{"default"}, b.canceled, "counted as the console's cancels")
	b.mu.Unlock()

	_, err = b.jobs.Pool.Exec(ctx, `UPDATE provider_batches SET state = 'canceled', ended_at = now() WHERE id = $1`, batchID)
	require.NoError(t, err)
	var res struct {
		Message     string `json:"message"`
		Changed     bool   `json:"changed"`
		JobsDeleted int    `json:"jobs_deleted"`
	}
	c.json(http.MethodPost, "/console/api/tenants/acme/delete", nil, &res)
	require.Equal(t, "tenant acme deleted, with 1 jobs and its tokens (0 jobs canceled first)", res.Message)
	require.True(t, res.Changed)
	require.Equal(t, 1, res.JobsDeleted)
	_, err = store.Get(ctx, "acme")
	require.ErrorIs(t, err, tenant.ErrNotFound)
	var n int
	require.NoError(t, b.jobs.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE tenant = 'acme'`).Scan(&n))
	require.Zero(t, n)
	got, err = b.jobs.Store.Get(ctx, other.ID)
	require.NoError(t, err, "another tenant's job is untouched")
	require.Equal(t, jobs.StatusQueued, got.Status)
	r, out = c.do(http.MethodPost, "/console/api/tenants/acme/delete", nil, nil)
	requireError(t, r, out, http.StatusNotFound, "not_found")

	var actions []string
	for _, e := range b.audit(t) {
		actions = append(actions, fmt.Sprintf("%s %s %d %v", e.Action, e.Target, e.Count, e.Detail["jobs_deleted"]))
	}
	require.Equal(t, []string{"tenant.delete acme 1 1", "tenant.delete acme 0 2", "tenant.cancel_jobs acme 1 <nil>",
		"tenant.revoke acme 1 <nil>", "login  1 <nil>"}, actions)
}

// TestTenants_RevokeCancelJobsCancelsItsDeadLetters: "Revoke, cancel its jobs" cancels the
// tenant's dead letters too, as `ctl tenants revoke --cancel-jobs` does, so that a retry of every
// dead letter (after an outage) does not send them again and pay for answers the revoked tenant
// can no longer read; another tenant's dead letter stays one. They stayed dead letters.
func TestTenants_RevokeCancelJobsCancelsItsDeadLetters(t *testing.T) {
	t.Parallel()
	b := setupConfig(t, func(cfg *console.Config) { cfg.RevokeSettle = -1 }) // no replica caches it here
	c := b.login(t)
	ctx := context.Background()
	store := tenant.NewStore(b.jobs.Pool, nil)
	for _, name := range []string{"acme", "other"} {
		_, _, err := store.Create(ctx, name, nil)
		require.NoError(t, err)
	}
	queued := b.jobs.Create(t, jobstest.Opts{Tenant: "acme"})
	dead := b.jobs.Dead(t, jobstest.Opts{Tenant: "acme"}, jobs.ReasonRetriesExhausted, 1)
	other := b.jobs.Dead(t, jobstest.Opts{Tenant: "other"}, jobs.ReasonRetriesExhausted, 1)

	var res struct {
		Message     string `json:"message"`
		Canceled    int    `json:"canceled"`
		DeadLetters int    `json:"dead_letters"`
	}
	c.json(http.MethodPost, "/console/api/tenants/acme/revoke", map[string]any{"cancel_jobs": true}, &res)
	require.Equal(t, "tenant acme revoked; canceled 2 jobs of it (1 of them dead letters, which no retry sends now)", res.Message)
	require.Equal(t, 2, res.Canceled)
	require.Equal(t, 1, res.DeadLetters)
	for j, want := range map[*jobs.Job]jobs.Status{queued: jobs.StatusCanceled, dead: jobs.StatusCanceled, other: jobs.StatusDead} {
		got, err := b.jobs.Store.Get(ctx, j.ID)
		require.NoError(t, err)
		require.Equal(t, want, got.Status, "job of %s", j.Tenant)
	}
	var entries []string
	for _, e := range b.audit(t) {
		entries = append(entries, fmt.Sprintf("%s %s %d %v", e.Action, e.Target, e.Count, e.Detail["dead_letters"]))
	}
	require.Equal(t, []string{"tenant.cancel_jobs acme 2 1", "tenant.revoke acme 1 <nil>", "login  1 <nil>"}, entries)
}

// TestTenants_RevokeCancelJobsIncompleteSaysRunAgain: a revoke with cancel_jobs whose cancels
// Postgres stopped (here the job store's connection is cut after the revocation) answers what was
// done and that not every job may be canceled, with what to do (cancel them again), as ctl's
// "run again" does. The answer said only that the database was unreachable, as if nothing had
// been done: the operator did not know the tenant was revoked, nor that its jobs still ran.
func TestTenants_RevokeCancelJobsIncompleteSaysRunAgain(t *testing.T) {
	t.Parallel()
	var proxy *pgtest.Proxy
	b := setupConfig(t, func(cfg *console.Config) {
		cfg.RevokeSettle = -1 // no replica caches it here
		var proxied string
		proxy, proxied = pgtest.NewProxy(t, cfg.Pool.Config().ConnString())
		pool, err := pgxpool.New(context.Background(), proxied)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		cfg.Jobs = jobs.NewStore(pool, nil)
	})
	c := b.login(t)
	_, _, err := tenant.NewStore(b.jobs.Pool, nil).Create(context.Background(), "acme", nil)
	require.NoError(t, err)
	queued := b.jobs.Create(t, jobstest.Opts{Tenant: "acme"})
	proxy.Cut()

	res, out := doWithin(t, c, http.MethodPost, "/console/api/tenants/acme/revoke", map[string]any{"cancel_jobs": true})
	requireError(t, res, out, http.StatusServiceUnavailable, "unavailable")
	msg := errorMessage(t, out)
	require.Contains(t, msg, "tenant acme revoked")
	require.Contains(t, msg, "not every job of it may be canceled")
	require.Contains(t, msg, "cancel its jobs again")
	got, err := b.jobs.Store.Get(context.Background(), queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status, "the cancels did not reach Postgres")
}
