package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

// TestTenants_Delete: `ctl tenants delete` refuses a tenant that is not revoked (and the
// anonymous requests' tenant); on a revoked one it cancels the jobs that have not ended (their
// tasks aborted), deletes every job of it with its attempts, events and idempotency keys, keeps
// a job in a provider batch still open (and the tenant, saying so, exit 1) until that batch has
// ended, then deletes the tenant and its tokens. Another tenant's jobs are untouched; the audit
// log keeps the record; the name can be given to a new tenant, whose key space is empty.
func TestTenants_Delete(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	ctx := context.Background()
	redis, insp, queue := redisArgs(t)
	opt, err := dispatch.RedisConnOpt(redisArgsURL(redis))
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	defer client.Close()
	enq := dispatch.NewEnqueuer(client, queue, nil)
	store := tenant.NewStore(b.pool, nil)
	_, token, err := store.Create(ctx, "acme", nil)
	require.NoError(t, err)
	_, err = store.Rotate(ctx, "acme", time.Hour) // a previous token too
	require.NoError(t, err)
	_, _, err = store.Create(ctx, "other", nil)
	require.NoError(t, err)
	create := func(tn, key string) *jobs.Job {
		job, _, err := b.store.Create(ctx, jobs.CreateParams{Tenant: tn, Credential: "default", IdempotencyKey: key,
			Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Minute})
		require.NoError(t, err)
		require.NoError(t, enq.Enqueue(ctx, job.ID, "", time.Time{}))
		return job
	}
	queued, done, dead, inBatch := create("acme", "k1"), create("acme", "k2"), create("acme", ""), create("acme", "")
	b.attempt(t, done.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	b.attempt(t, dead.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
	// A canceled job still in a sent batch: the batch lane reads it until the batch ends.
	const batchID = "00000000-0000-4000-8000-0000000000b1"
	_, err = b.pool.Exec(ctx, `INSERT INTO provider_batches (id, credential, model, state, provider_batch_id)
VALUES ($1, 'default', 'm', 'submitted', 'pb_1')`, batchID)
	require.NoError(t, err)
	_, err = b.store.Cancel(ctx, inBatch.ID)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE jobs SET batch_ref = $2 WHERE id = $1`, inBatch.ID, batchID)
	require.NoError(t, err)
	others := create("other", "k1")

	args := append([]string{"--database-url", b.url}, redis...)
	// No API replica caches an answer here: nothing to wait for after the revocation.
	run := func(args ...string) result {
		r, _ := runApp(30*time.Second, func(a *app) { a.revokeSettle = 0 }, args...)
		return r
	}
	del := func(name string) result { return run(append(args, "tenants", "delete", name)...) }

	requireOneLineError(t, del("acme"), 1, "tenant acme is not revoked: only a revoked tenant is deleted (ctl tenants revoke acme --cancel-jobs)")
	requireOneLineError(t, del("nobody"), 1, `tenant not found: "nobody"`)
	requireOneLineError(t, del("default"), 2, "the anonymous requests' tenant is not deleted")
	requireOneLineError(t, run(append(args, "tenants", "delete")...), 2, "usage: ctl tenants delete NAME")
	requireOneLineError(t, run(append(args, "tenants", "delete", "a", "b")...), 2, "usage: ctl tenants delete NAME")
	require.Empty(t, auditLog(t, b.url), "refusals are not audited")
	got, err := b.store.Get(ctx, queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status, "a refusal changes nothing")

	require.Equal(t, 0, run(append(args, "tenants", "revoke", "acme")...).code)
	r := del("acme")
	require.Equal(t, 1, r.code, r.errOut)
	require.Equal(t, "canceled 1 jobs of tenant acme\ndeleted 3 jobs of tenant acme\n", r.out)
	require.Contains(t, r.errOut, "tenant acme kept: 1 of its jobs are left (0 not ended, 1 in a provider batch still open")
	_, err = insp.GetTaskInfo(queue, queued.ID)
	require.ErrorIs(t, err, asynq.ErrTaskNotFound, "the canceled job's task is gone")
	_, err = store.Get(ctx, "acme")
	require.NoError(t, err, "kept while a job is left")

	// The batch lane ends the batch (its jobs all canceled): a second run finishes.
	_, err = b.pool.Exec(ctx, `UPDATE provider_batches SET state = 'canceled', ended_at = now() WHERE id = $1`, batchID)
	require.NoError(t, err)
	r = del("acme")
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "tenant acme deleted, with 1 jobs (their attempts, events and idempotency keys) and its tokens\n", r.out)

	ids := []string{queued.ID, done.ID, dead.ID, inBatch.ID}
	for _, q := range []struct {
		sql string
		arg any
	}{
		{`SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[])`, ids},
		{`SELECT count(*) FROM jobs WHERE tenant = $1`, "acme"},
		{`SELECT count(*) FROM job_attempts WHERE job_id = ANY($1::uuid[])`, ids},
		{`SELECT count(*) FROM job_events WHERE job_id = ANY($1::uuid[])`, ids},
		{`SELECT count(*) FROM idempotency_keys WHERE tenant = $1`, "acme"},
		{`SELECT count(*) FROM tenant_previous_tokens WHERE tenant = $1`, "acme"},
		{`SELECT count(*) FROM tenants WHERE name = $1`, "acme"},
	} {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, q.sql, q.arg).Scan(&n))
		require.Zero(t, n, q.sql)
	}
	got, err = b.store.Get(ctx, others.ID)
	require.NoError(t, err, "another tenant's job is untouched")
	require.Equal(t, jobs.StatusQueued, got.Status)
	var keys int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE tenant = 'other'`).Scan(&keys))
	require.Equal(t, 1, keys)
	_, err = store.Authenticate(ctx, token)
	require.ErrorIs(t, err, tenant.ErrUnknownBearerToken)
	requireOneLineError(t, del("acme"), 1, `tenant not found: "acme"`)

	var actions []string
	for _, e := range auditLog(t, b.url) {
		actions = append(actions, fmt.Sprintf("%s %s %d %v", e.Action, e.Target, e.Count, e.Detail["jobs_deleted"]))
	}
	require.Equal(t, []string{"tenant.delete acme 1 1", "tenant.delete acme 0 3", "tenant.cancel_jobs acme 1 <nil>", "tenant.revoke acme 1 <nil>"}, actions)

	// The name is free again: a new tenant of it starts with no job and no key.
	r = run(append(args, "tenants", "create", "acme")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.True(t, strings.HasPrefix(r.out, tenant.BearerTokenPrefix))
	job, replay, err := b.store.Create(ctx, jobs.CreateParams{Tenant: "acme", Credential: "default", IdempotencyKey: "k1",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	require.False(t, replay, "the old tenant's key is gone")
	require.NotEqual(t, queued.ID, job.ID)
}

// TestTenants_DeleteInterruptedBeforeAnythingSaysRunAgain: a deletion interrupted before it
// changed anything (here during the wait for the revocation to reach the API replicas) says so
// and what to do, as one interrupted halfway does; it printed the bare "context deadline
// exceeded", as if the command had not begun.
func TestTenants_DeleteInterruptedBeforeAnythingSaysRunAgain(t *testing.T) {
	t.Parallel()
	b, redis, store := revokedAcme(t)

	r, expired := runApp(3*time.Second, func(a *app) { a.revokeSettle = time.Hour },
		append(append([]string{"--database-url", b.url}, redis...), "tenants", "delete", "acme")...)
	require.True(t, expired, "interrupted in the settle")
	requireOneLineError(t, r, 1, "tenant acme not deleted (nothing was changed): run `ctl tenants delete acme` again")
	_, err := store.Get(t.Context(), "acme")
	require.NoError(t, err)
}

// TestTenants_DeleteCommitCutDoesNotSayNothingChanged: a deletion whose last COMMIT (the tenant's
// own row, a tenant without jobs) --timeout cut may have deleted the tenant: the message must not
// say "nothing was changed" next to the hint that the COMMIT may have been applied. It said both,
// on one line, as the counts of jobs canceled and deleted were 0.
func TestTenants_DeleteCommitCutDoesNotSayNothingChanged(t *testing.T) {
	t.Parallel()
	b, redis, _ := revokedAcme(t)
	r := deleteAcmeBreakingCommit(t, b, append([]string{"--timeout", "1s"}, redis...), func(t *testing.T, ctx context.Context, proxy *pgtest.Proxy, send func()) {
		silenced := proxy.SilenceStatement("commit")
		send()
		require.True(t, silenced(ctx), "the COMMIT was not sent")
	})
	requireOneLineError(t, r, 1, "to a COMMIT: what it changed may have been applied; check with a list or show command (ctl tenants list)")
	require.NotContains(t, r.errOut, "nothing was changed")
}

// TestTenants_DeleteCommitLostDoesNotSayNothingChanged: a deletion whose last COMMIT (the
// tenant's own row) was sent and whose connection then failed, before Postgres answered, may have
// deleted the tenant: without --timeout (0), or with one that did not fire, the message says so
// and names the list to check, as a COMMIT --timeout cut does. It said "nothing was changed: run
// ... again".
func TestTenants_DeleteCommitLostDoesNotSayNothingChanged(t *testing.T) {
	t.Parallel()
	for name, timeout := range map[string][]string{"NoTimeout": {"--timeout", "0"}, "DefaultTimeout": nil} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, redis, _ := revokedAcme(t)
			r := deleteAcmeBreakingCommit(t, b, append(timeout, redis...), loseCommit)
			requireOneLineError(t, r, 1, "postgres did not answer a COMMIT, its connection failed or the command was interrupted: "+
				"what it changed may have been applied; check with a list or show command (ctl tenants list)")
			require.NotContains(t, r.errOut, "nothing was changed")
		})
	}
}

// TestTenants_DeleteCommitLostAfterItsJobsDoesNotSayNotDeleted: a deletion that deleted the
// tenant's jobs and whose last COMMIT (the tenant's row) got no answer may have deleted the
// tenant: the message must not say "not deleted" next to the hint that the COMMIT may have been
// applied. It said "tenant acme not deleted (its jobs are canceled)", as jobs were deleted.
func TestTenants_DeleteCommitLostAfterItsJobsDoesNotSayNotDeleted(t *testing.T) {
	t.Parallel()
	b, redis, _ := revokedAcme(t)
	job, _, err := b.store.Create(t.Context(), jobs.CreateParams{Tenant: "acme", Credential: "default",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	r := deleteAcmeBreakingCommit(t, b, redis, loseCommit)
	requireOneLineError(t, r, 1, "tenant acme may not be deleted (its jobs are canceled): run `ctl tenants delete acme` again if `ctl tenants list` shows it")
	require.Contains(t, r.errOut, "what it changed may have been applied; check with a list or show command (ctl tenants list)")
	require.NotContains(t, r.errOut, "not deleted")
}

// loseCommit breaks ctl's connection once the COMMIT that send lets go is sent: Postgres does
// not answer it.
func loseCommit(t *testing.T, ctx context.Context, proxy *pgtest.Proxy, send func()) {
	commit := proxy.HoldStatement("commit")
	defer commit.Release()
	send()
	select {
	case <-commit.Reached():
	case <-ctx.Done():
		t.Fatal("the COMMIT was not sent")
	}
	proxy.Reset() // ctl's connection fails with the COMMIT sent, unanswered
}

// deleteAcmeBreakingCommit runs `ctl tenants delete acme` with args through a proxy that holds
// the deletion of the tenant's row, then has breakCommit break its COMMIT (send lets the row's
// deletion go on), and returns what ctl said.
func deleteAcmeBreakingCommit(t *testing.T, b *jobsBundle, args []string, breakCommit func(t *testing.T, ctx context.Context, proxy *pgtest.Proxy, send func())) result {
	t.Helper()
	proxy, proxied := pgtest.NewProxy(t, b.url)
	last := proxy.HoldStatement("DELETE FROM tenants WHERE")
	defer last.Release()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		r, _ := runApp(20*time.Second, func(a *app) { a.revokeSettle = 0 },
			append(append([]string{"--database-url", proxied}, args...), "tenants", "delete", "acme")...)
		done <- r
	}()
	select {
	case <-last.Reached():
	case <-ctx.Done():
		t.Fatal("the tenant's row was not deleted")
	}
	breakCommit(t, ctx, proxy, last.Release)
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		t.Fatal("ctl did not end")
		return result{}
	}
}

// revokedAcme is a jobs database holding the tenant acme, revoked (ready for `tenants delete`),
// the Redis arguments of ctl, and the tenant store.
func revokedAcme(t *testing.T) (*jobsBundle, []string, *tenant.Store) {
	t.Helper()
	b := setupJobs(t)
	redis, _, _ := redisArgs(t)
	store := tenant.NewStore(b.pool, nil)
	_, _, err := store.Create(t.Context(), "acme", nil)
	require.NoError(t, err)
	_, err = store.Revoke(t.Context(), "acme")
	require.NoError(t, err)
	return b, redis, store
}
