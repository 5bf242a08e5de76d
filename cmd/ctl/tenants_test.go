package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tenant"
)

func TestTenants_CreateListRevoke(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url, "tenants"}
	store := tenant.NewStore(b.pool, nil)

	// create prints the token alone on the output, the notice on the error output.
	r := run(t, append(db, "create", "acme")...)
	require.Equal(t, 0, r.code, r.errOut)
	token := strings.TrimSuffix(r.out, "\n")
	require.True(t, strings.HasPrefix(token, tenant.BearerTokenPrefix), r.out)
	require.NotContains(t, token, "\n")
	require.Contains(t, r.errOut, "tenant acme created (credentials: all), weight 1;")
	require.Contains(t, r.errOut, "not shown again")
	got, err := store.Authenticate(context.Background(), token)
	require.NoError(t, err)
	require.Equal(t, "acme", got.Name)

	r = run(t, append(db, "create", "limited", "--credentials", "default, oai")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.errOut, "(credentials: default,oai)")
	for i, args := range [][]string{{"--credentials", "a", "flag-first"}, {"flag-after", "--credentials=a"}} {
		r = run(t, append(db, append([]string{"create"}, args...)...)...)
		require.Equal(t, 0, r.code, "form %d: %s", i, r.errOut)
		require.Contains(t, r.errOut, "(credentials: a)")
	}

	requireOneLineError(t, run(t, append(db, "create", "acme")...), 2, `tenant exists: "acme"`)
	// A name that differs from acme's only in case would make a tenant no one tells apart.
	requireOneLineError(t, run(t, append(db, "create", "Acme")...), 2,
		`tenant exists: "Acme" differs from tenant "acme" only in case`)
	requireOneLineError(t, run(t, append(db, "create", "no/slash")...), 2, "invalid name")
	requireOneLineError(t, run(t, append(db, "create", "x", "--credentials", " , ")...), 2, "at least one credential")
	requireOneLineError(t, run(t, append(db, "create")...), 2, "usage: ctl tenants create NAME")
	requireOneLineError(t, run(t, append(db, "create", "a", "b")...), 2, "usage: ctl tenants create NAME")

	// revoke: the token now answers ErrRevoked; a second revoke says so.
	r = run(t, append(db, "revoke", "acme")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "tenant acme revoked\n", r.out)
	_, err = store.Authenticate(context.Background(), token)
	require.ErrorIs(t, err, tenant.ErrRevoked)
	r = run(t, append(db, "revoke", "acme")...)
	require.Equal(t, "tenant acme was revoked already\n", r.out)
	requireOneLineError(t, run(t, append(db, "revoke", "nobody")...), 1, `tenant not found: "nobody"`)

	// list shows both, never a token or its hash.
	r = run(t, append(db, "list", "--json")...)
	require.Equal(t, 0, r.code, r.errOut)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.out), &rows))
	require.Len(t, rows, 4)
	require.Equal(t, "acme", rows[0]["name"])
	require.Nil(t, rows[0]["credentials"])
	require.NotNil(t, rows[0]["revoked_at"])
	require.Equal(t, "limited", rows[3]["name"])
	require.Equal(t, []any{"default", "oai"}, rows[3]["credentials"])
	require.Nil(t, rows[3]["revoked_at"])
	require.NotContains(t, r.out, token[len(tenant.BearerTokenPrefix):])
	require.NotContains(t, r.out, "token")

	table := run(t, append(db, "list")...)
	require.Equal(t, 0, table.code)
	lines := strings.Split(strings.TrimSpace(table.out), "\n")
	require.Len(t, lines, 5)
	require.Regexp(t, `^NAME\s+CREDENTIALS\s+WEIGHT\s+CREATED\s+REVOKED\s+OLD TOKEN ENDS$`, lines[0])
	require.Regexp(t, `^acme\s+all\s+1\s+\S+\s+\d{4}-`, lines[1])
	require.Regexp(t, `^limited\s+default,oai\s+1\s+\S+\s+-\s+-$`, lines[4])

	// The four creates and the one revoke that changed something are in the audit log.
	var actions []string
	for _, e := range auditLog(t, b.url) {
		actions = append(actions, e.Action+" "+e.Target)
	}
	require.Equal(t, []string{"tenant.revoke acme", "tenant.create flag-after", "tenant.create flag-first",
		"tenant.create limited", "tenant.create acme"}, actions)
}

// TestTenants_Weight: create --weight, set --weight and list; a bad weight or usage is refused
// with one line.
func TestTenants_Weight(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url, "tenants"}

	r := run(t, append(db, "create", "big", "--weight", "3")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Contains(t, r.errOut, "tenant big created (credentials: all), weight 3;")
	r = run(t, append(db, "create", "small")...)
	require.Equal(t, 0, r.code, r.errOut)

	r = run(t, append(db, "set", "small", "--weight", "2")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "tenant small: weight 2\n", r.out)
	r = run(t, append(db, "set", "--weight=5", "big")...)
	require.Equal(t, 0, r.code, r.errOut)

	table := run(t, append(db, "list")...)
	require.Equal(t, 0, table.code)
	lines := strings.Split(strings.TrimSpace(table.out), "\n")
	require.Regexp(t, `^big\s+all\s+5\s`, lines[1])
	require.Regexp(t, `^small\s+all\s+2\s`, lines[2])
	r = run(t, append(db, "list", "--json")...)
	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.out), &rows))
	require.EqualValues(t, 5, rows[0]["weight"])
	entries := auditLog(t, b.url)
	require.Len(t, entries, 4, "two creates and two weights")
	require.Equal(t, "tenant.weight", entries[0].Action)
	require.Equal(t, "big", entries[0].Target)
	require.Equal(t, map[string]any{"weight": float64(5)}, entries[0].Detail)
	require.Equal(t, map[string]any{"credentials": nil, "weight": float64(3)}, entries[3].Detail)

	requireOneLineError(t, run(t, append(db, "set", "small", "--weight", "0")...), 2, "invalid weight: 0 (want 1..1000)")
	requireOneLineError(t, run(t, append(db, "create", "x", "--weight", "1001")...), 2, "invalid weight: 1001")
	requireOneLineError(t, run(t, append(db, "set", "nobody", "--weight", "2")...), 1, `tenant not found: "nobody"`)
	requireOneLineError(t, run(t, append(db, "set", "small")...), 2, "usage: ctl tenants set NAME --weight N")
	requireOneLineError(t, run(t, append(db, "set", "--weight", "2")...), 2, "usage: ctl tenants set NAME --weight N")
}

func TestTenants_ListEmptyAndUnreachable(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	r := run(t, "--database-url", b.url, "tenants", "list", "--json")
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "[]\n", r.out)
	r = run(t, "--database-url", b.url, "tenants", "list")
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "no tenants (ctl tenants create NAME)\n", r.out)
	requireOneLineError(t, run(t, "--database-url", unreachableURL, "tenants", "list"), 1, "postgres unreachable")
	require.Equal(t, 2, run(t, "tenants").code)
}

// configFile writes a config file of the database at databaseURL with one credential, name of
// provider (unreachable: its key a test one), and returns its path.
func configFile(t *testing.T, databaseURL, name, provider string) string {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(keyFile, []byte("sk-ctl-test\n"), 0o600))
	cfgFile := filepath.Join(dir, "llmq.yaml")
	require.NoError(t, os.WriteFile(cfgFile, fmt.Appendf(nil, `
database_url: %s
credentials:
  - { name: %s, provider: %s, base_url: "http://127.0.0.1:1", api_key_file: %s }
`, databaseURL, name, provider, keyFile), 0o600))
	return cfgFile
}

func TestTenants_CredentialsCheckedAgainstConfig(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	cfgFile := configFile(t, b.url, "main", "anthropic")

	requireOneLineError(t, run(t, "--config", cfgFile, "tenants", "create", "acme", "--credentials", "main,typo"), 2,
		`--credentials: not in the config: "typo"`)
	r := run(t, "--config", cfgFile, "tenants", "create", "acme", "--credentials", "main")
	require.Equal(t, 0, r.code, r.errOut)
	require.True(t, strings.HasPrefix(r.out, tenant.BearerTokenPrefix))
}

// TestAudit_RefusedWriteFailsTheCommand: a change made when the audit log then refuses its entry
// (here, its table gone) fails the command with one line, and the change stays made.
func TestAudit_RefusedWriteFailsTheCommand(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url, "tenants"}
	r := run(t, append(db, "create", "acme")...)
	require.Equal(t, 0, r.code, r.errOut)
	_, err := b.pool.Exec(context.Background(), `DROP TABLE audit_log`)
	require.NoError(t, err)

	r = run(t, append(db, "set", "acme", "--weight", "4")...)
	requireOneLineError(t, r, 1, "write audit log")
	w, err := tenant.NewStore(b.pool, nil).Weight(context.Background(), "acme")
	require.NoError(t, err)
	require.Equal(t, 4, w, "the change stays made")

	// An operator created is shown its token even so: it exists nowhere else.
	r = run(t, "--database-url", b.url, "operators", "create", "alice")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.errOut, "write audit log")
	require.True(t, strings.HasPrefix(r.out, "llmqop_"), "stdout %q", r.out)
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT count(*) FROM operators WHERE name = 'alice'`).Scan(&n))
	require.Equal(t, 1, n)
}

// TestTenants_RevokeCancelsJobs: `revoke --cancel-jobs` also ends the tenant's work that has not
// ended (queued, retrying, running: an attempt in flight is aborted), and none of another
// tenant's or of its own finished jobs: once revoked, the tenant can neither read nor cancel them,
// and they would go on spending the provider's budget. Without the flag they stay as they are.
func TestTenants_RevokeCancelsJobs(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	redis, insp, queue := redisArgs(t)
	opt, err := dispatch.RedisConnOpt(redisArgsURL(redis))
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	defer client.Close()
	enq := dispatch.NewEnqueuer(client, queue, nil)
	store := tenant.NewStore(b.pool, nil)
	for _, name := range []string{"acme", "other", "kept"} {
		_, _, err := store.Create(context.Background(), name, nil)
		require.NoError(t, err)
	}
	create := func(tn string) *jobs.Job {
		job, _, err := b.store.Create(context.Background(), jobs.CreateParams{Tenant: tn, Credential: "default",
			Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Minute})
		require.NoError(t, err)
		require.NoError(t, enq.Enqueue(context.Background(), job.ID, "", time.Time{}))
		return job
	}
	queued, retrying, running, done := create("acme"), create("acme"), create("acme"), create("acme")
	later := time.Now().Add(time.Minute)
	b.attempt(t, retrying.ID, jobs.Outcome{Status: jobs.StatusRetrying, NextAttemptAt: &later})
	_, err = b.store.BeginAttempt(context.Background(), running.ID)
	require.NoError(t, err)
	b.attempt(t, done.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
	others, kept := create("other"), create("kept")
	args := append([]string{"--database-url", b.url}, redis...)
	// No API replica caches an answer here: nothing to wait for after the revocation.
	run := func(t *testing.T, args ...string) result {
		r, _ := runApp(30*time.Second, func(a *app) { a.revokeSettle = 0 }, args...)
		return r
	}

	r := run(t, append(args, "tenants", "revoke", "kept")...)
	require.Equal(t, 0, r.code, r.errOut)
	r = run(t, append(args, "tenants", "revoke", "acme", "--cancel-jobs")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "tenant acme revoked\ncanceled 3 jobs of tenant acme\n", r.out)
	for _, j := range []*jobs.Job{queued, retrying, running} {
		got, err := b.store.Get(context.Background(), j.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
	}
	_, err = insp.GetTaskInfo(queue, queued.ID)
	require.ErrorIs(t, err, asynq.ErrTaskNotFound, "its task is gone")
	for j, want := range map[*jobs.Job]jobs.Status{done: jobs.StatusSucceeded, others: jobs.StatusQueued, kept: jobs.StatusQueued} {
		got, err := b.store.Get(context.Background(), j.ID)
		require.NoError(t, err)
		require.Equal(t, want, got.Status, "tenant %s", j.Tenant)
	}

	// Revoked already: its jobs are canceled all the same, here after the default wait for the
	// replicas' caches (3 s).
	r, _ = runTimeout(30*time.Second, append(args, "tenants", "revoke", "kept", "--cancel-jobs")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "tenant kept was revoked already\ncanceled 1 jobs of tenant kept\n", r.out)
	requireOneLineError(t, run(t, append(args, "tenants", "revoke", "nobody", "--cancel-jobs")...), 1, `tenant not found: "nobody"`)

	var actions []string
	for _, e := range auditLog(t, b.url) {
		actions = append(actions, fmt.Sprintf("%s %s %d", e.Action, e.Target, e.Count))
	}
	require.Equal(t, []string{"tenant.cancel_jobs kept 1", "tenant.cancel_jobs acme 3", "tenant.revoke acme 1", "tenant.revoke kept 1"}, actions)
}

// TestTenants_Rotate: rotate prints the new token alone on the output (as create), the notice
// with the old token's end on the error output; the old token works for the overlap (none with
// --overlap 0); the rotation is audited without the token; usage and refusals are one line.
func TestTenants_Rotate(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	db := []string{"--database-url", b.url, "tenants"}
	store := tenant.NewStore(b.pool, nil)
	ctx := context.Background()
	r := run(t, append(db, "create", "acme")...)
	require.Equal(t, 0, r.code, r.errOut)
	first := strings.TrimSuffix(r.out, "\n")

	r = run(t, append(db, "rotate", "acme")...)
	require.Equal(t, 0, r.code, r.errOut)
	second := strings.TrimSuffix(r.out, "\n")
	require.True(t, strings.HasPrefix(second, tenant.BearerTokenPrefix), r.out)
	require.NotContains(t, second, "\n")
	require.NotEqual(t, first, second)
	require.Regexp(t, `^tenant acme: new bearer token; the old one ends at \d{4}-\S+Z \(in 24h0m0s\)\. The new token follows and is not shown again:\n$`, r.errOut)
	for _, tok := range []string{first, second} {
		_, err := store.Authenticate(ctx, tok)
		require.NoError(t, err)
	}
	// The list shows the rotation in progress: when the old token ends.
	ends, err := time.Parse(time.RFC3339, regexp.MustCompile(`ends at (\S+)`).FindStringSubmatch(r.errOut)[1])
	require.NoError(t, err)
	table := run(t, append(db, "list")...)
	require.Equal(t, 0, table.code, table.errOut)
	require.Regexp(t, `^NAME\s+CREDENTIALS\s+WEIGHT\s+CREATED\s+REVOKED\s+OLD TOKEN ENDS\n`, table.out)
	require.Regexp(t, `\nacme\s+all\s+1\s+\S+\s+-\s+`+regexp.QuoteMeta(ends.Local().Format(time.RFC3339))+`\n`, table.out)

	r = run(t, append(db, "rotate", "--overlap", "0", "acme")...)
	require.Equal(t, 0, r.code, r.errOut)
	third := strings.TrimSuffix(r.out, "\n")
	require.Equal(t, "tenant acme: new bearer token; the old one ends at once, and the token of the earlier rotation still in its overlap ended now. The new token follows and is not shown again:\n", r.errOut)
	for _, tok := range []string{first, second} {
		_, err := store.Authenticate(ctx, tok)
		require.ErrorIs(t, err, tenant.ErrRotatedOut)
	}
	_, err = store.Authenticate(ctx, third)
	require.NoError(t, err)
	table = run(t, append(db, "list")...)
	require.Regexp(t, `\nacme\s+all\s+1\s+\S+\s+-\s+-\n`, table.out, "no token in an overlap")

	entries := auditLog(t, b.url)
	require.Len(t, entries, 3)
	require.Equal(t, "tenant.rotate", entries[0].Action)
	require.Equal(t, "acme", entries[0].Target)
	require.Equal(t, "0s", entries[0].Detail["overlap"])
	require.EqualValues(t, 1, entries[0].Detail["ended"])
	require.Equal(t, "24h0m0s", entries[1].Detail["overlap"])
	all := run(t, "--database-url", b.url, "audit", "--json")
	for _, tok := range []string{first, second, third} {
		require.NotContains(t, all.out, tok[len(tenant.BearerTokenPrefix):])
	}

	requireOneLineError(t, run(t, append(db, "rotate", "nobody")...), 1, `tenant not found: "nobody"`)
	requireOneLineError(t, run(t, append(db, "rotate")...), 2, "usage: ctl tenants rotate NAME [--overlap DURATION]")
	requireOneLineError(t, run(t, append(db, "rotate", "a", "b")...), 2, "usage: ctl tenants rotate NAME")
	requireOneLineError(t, run(t, append(db, "rotate", "acme", "--overlap", "-1s")...), 2, "--overlap must be 0..720h0m0s")
	requireOneLineError(t, run(t, append(db, "rotate", "acme", "--overlap", "721h")...), 2, "--overlap must be 0..720h0m0s")
	require.Equal(t, 0, run(t, append(db, "revoke", "acme")...).code)
	requireOneLineError(t, run(t, append(db, "rotate", "acme")...), 1, `tenant revoked: "acme" gets no new token`)
	require.Len(t, auditLog(t, b.url), 4, "refusals are not audited")
}

// TestTenants_RevokeCancelJobsOfAnOldRevocationDoesNotWait: `revoke --cancel-jobs` on a tenant
// revoked long ago cancels its jobs and ends at once: every replica's cache let go of the
// revocation long since, as `tenants delete` counts it (tenant.Store.RevokedFor). It waited the
// full settle (3 s; here 10 minutes) from its own run, as if it had just revoked the tenant.
func TestTenants_RevokeCancelJobsOfAnOldRevocationDoesNotWait(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	ctx := context.Background()
	redis, _, _ := redisArgs(t)
	store := tenant.NewStore(b.pool, nil)
	_, _, err := store.Create(ctx, "gone", nil)
	require.NoError(t, err)
	_, err = store.Revoke(ctx, "gone")
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `UPDATE tenants SET revoked_at = now() - interval '1 hour' WHERE name = 'gone'`)
	require.NoError(t, err)
	// A job a replica accepted before the revocation reached it.
	job, _, err := b.store.Create(ctx, jobs.CreateParams{Tenant: "gone", Credential: "default",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)

	r, expired := runApp(20*time.Second, func(a *app) { a.revokeSettle = 10 * time.Minute },
		append(append([]string{"--database-url", b.url}, redis...), "tenants", "revoke", "gone", "--cancel-jobs")...)
	require.False(t, expired, "it waited for a revocation an hour old to settle: %+v", r)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "tenant gone was revoked already\ncanceled 1 jobs of tenant gone\n", r.out)
	got, err := b.store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
}

// TestTenants_RevokeCancelJobsCancelsItsDeadLetters: `revoke --cancel-jobs` cancels the
// tenant's dead letters too (as DELETE /v1/jobs/{id} cancels one), so that an operator's later
// `dead retry --all` (after an outage) does not send them again and pay for answers the revoked
// tenant can no longer read; another tenant's dead letter is retried. They stayed dead, and the
// retry sent them.
func TestTenants_RevokeCancelJobsCancelsItsDeadLetters(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	ctx := context.Background()
	redis, _, _ := redisArgs(t)
	store := tenant.NewStore(b.pool, nil)
	for _, name := range []string{"gone", "other"} {
		_, _, err := store.Create(ctx, name, nil)
		require.NoError(t, err)
	}
	dead := func(tn string) *jobs.Job {
		job, _, err := b.store.Create(ctx, jobs.CreateParams{Tenant: tn, Credential: "default",
			Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 1, Timeout: time.Minute})
		require.NoError(t, err)
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
		return job
	}
	gone1, gone2, other := dead("gone"), dead("gone"), dead("other")
	args := append([]string{"--database-url", b.url}, redis...)

	r, _ := runApp(30*time.Second, func(a *app) { a.revokeSettle = 0 }, append(args, "tenants", "revoke", "gone", "--cancel-jobs")...)
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "tenant gone revoked\ncanceled 2 jobs of tenant gone (2 of them dead letters, which no retry sends now)\n", r.out)
	r = run(t, append(args, "dead", "retry", "--all")...)
	require.Equal(t, 0, r.code, r.errOut)
	for j, want := range map[*jobs.Job]jobs.Status{gone1: jobs.StatusCanceled, gone2: jobs.StatusCanceled, other: jobs.StatusQueued} {
		got, err := b.store.Get(ctx, j.ID)
		require.NoError(t, err)
		require.Equal(t, want, got.Status, "job of %s", j.Tenant)
	}
	var actions []string
	for _, e := range auditLog(t, b.url) {
		actions = append(actions, fmt.Sprintf("%s %s %d %v", e.Action, e.Target, e.Count, e.Detail["dead_letters"]))
	}
	require.Equal(t, []string{"dead.retry  1 <nil>", "tenant.cancel_jobs gone 2 2", "tenant.revoke gone 1 <nil>"}, actions)
}

// TestTenants_RevokeCancelJobsFailedOnPostgresSaysRunAgain: when Postgres fails the cancels of
// `revoke --cancel-jobs` (here a trigger refuses them), the one-line error tells the operator to
// run the command again, and a second run, once Postgres takes them, cancels what is left: the
// command is idempotent (the revocation is not made, nor audited, twice; the jobs canceled
// already are not counted again). It said only Postgres's error.
func TestTenants_RevokeCancelJobsFailedOnPostgresSaysRunAgain(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	ctx := context.Background()
	redis, _, _ := redisArgs(t)
	_, _, err := tenant.NewStore(b.pool, nil).Create(ctx, "gone", nil)
	require.NoError(t, err)
	create := func(maxAttempts int) *jobs.Job {
		job, _, err := b.store.Create(ctx, jobs.CreateParams{Tenant: "gone", Credential: "default",
			Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: maxAttempts, Timeout: time.Minute})
		require.NoError(t, err)
		return job
	}
	waiting, dead := create(3), create(1)
	b.attempt(t, dead.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
	_, err = b.pool.Exec(ctx, `
CREATE FUNCTION refuse_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'cancel refused by the test'; END $$;
CREATE TRIGGER refuse_cancel BEFORE UPDATE ON jobs FOR EACH ROW WHEN (NEW.status = 'canceled') EXECUTE FUNCTION refuse_cancel()`)
	require.NoError(t, err)
	args := append([]string{"--database-url", b.url}, redis...)
	revoke := func() result {
		r, _ := runApp(30*time.Second, func(a *app) { a.revokeSettle = 0 }, append(args, "tenants", "revoke", "gone", "--cancel-jobs")...)
		return r
	}

	r := revoke()
	require.Equal(t, 1, r.code, r.errOut)
	require.Equal(t, "tenant gone revoked\n", r.out)
	require.Equal(t, 1, strings.Count(r.errOut, "\n"), "one line: %q", r.errOut)
	require.Contains(t, r.errOut, "cancel refused by the test")
	require.Contains(t, r.errOut, "run `ctl tenants revoke gone --cancel-jobs` again")

	_, err = b.pool.Exec(ctx, `DROP TRIGGER refuse_cancel ON jobs; DROP FUNCTION refuse_cancel()`)
	require.NoError(t, err)
	r = revoke()
	require.Equal(t, 0, r.code, r.errOut)
	require.Equal(t, "tenant gone was revoked already\ncanceled 2 jobs of tenant gone (1 of them dead letters, which no retry sends now)\n", r.out)
	for _, j := range []*jobs.Job{waiting, dead} {
		got, err := b.store.Get(ctx, j.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
	}
	var actions []string
	for _, e := range auditLog(t, b.url) {
		actions = append(actions, fmt.Sprintf("%s %s %d", e.Action, e.Target, e.Count))
	}
	require.Equal(t, []string{"tenant.cancel_jobs gone 2", "tenant.revoke gone 1"}, actions)
}

// TestTenantsCreate_RefusesAnEmptyCredentialName: `--credentials default,,openai` (and a comma
// at either end) is refused as a usage error naming the empty name, and no tenant is created.
// It dropped the empty name silently: a typo (a name lost between two commas) made a tenant
// that could not use the credential meant.
func TestTenantsCreate_RefusesAnEmptyCredentialName(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	for i, list := range []string{"default,,openai", "default,openai,", ",default", "default, ,openai"} {
		name := fmt.Sprintf("t%d", i)
		r := run(t, "--database-url", b.url, "tenants", "create", name, "--credentials", list)
		requireOneLineError(t, r, 2, fmt.Sprintf("--credentials %q: an empty credential name", list))
		require.Empty(t, r.out, "no token: %s", list)
		_, err := tenant.NewStore(b.pool, nil).Get(t.Context(), name)
		require.ErrorIs(t, err, tenant.ErrNotFound, "%s: no tenant created", list)
	}
}
