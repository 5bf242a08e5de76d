package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
)

func TestJobsList(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	first := b.createJob(t)
	second := b.createJob(t)
	b.attempt(t, second.ID, jobs.Outcome{Status: jobs.StatusSucceeded})

	t.Run("Table", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "jobs", "list")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Empty(t, r.errOut)
		rows := tableRows(r.out)
		require.Equal(t, []string{"ID", "STATUS", "TENANT", "CREDENTIAL", "ATTEMPTS", "CREATED", "FINISHED"}, rows[0])
		require.Len(t, rows, 3)
		require.Equal(t, []string{second.ID, "succeeded", "default", "default", "1/3"}, rows[1][:5], "newest first")
		require.Equal(t, []string{first.ID, "queued", "default", "default", "0/3"}, rows[2][:5])
		require.Equal(t, "-", rows[2][6])
		_, err := time.Parse(time.RFC3339, rows[1][6])
		require.NoError(t, err)
	})
	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "jobs", "list", "--json", "--status", "queued")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		var got []struct {
			ID       string `json:"id"`
			Status   string `json:"status"`
			Attempts int    `json:"attempts"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
		require.Len(t, got, 1)
		require.Equal(t, first.ID, got[0].ID)
		require.Equal(t, "queued", got[0].Status)
	})
	t.Run("Limit", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "jobs", "list", "--limit", "1")
		require.Equal(t, 0, r.code)
		require.Len(t, tableRows(r.out), 2)
	})
	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "jobs", "list", "--status", "dead")
		require.Equal(t, 0, r.code)
		require.Equal(t, "no jobs\n", r.out)
		r = run(t, "--database-url", b.url, "jobs", "list", "--status", "dead", "--json")
		require.Equal(t, 0, r.code)
		require.Equal(t, "[]\n", r.out)
	})
	t.Run("BadStatus", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "jobs", "list", "--status", "done")
		requireOneLineError(t, r, 2, `--status "done"`)
	})
}

func TestJobsCancel(t *testing.T) {
	t.Parallel()

	t.Run("Queued", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, insp, queue := redisArgs(t)
		job := b.createJob(t)
		opt, err := dispatch.RedisConnOpt(redisArgsURL(redis))
		require.NoError(t, err)
		client := asynq.NewClient(opt)
		defer client.Close()
		require.NoError(t, dispatch.NewEnqueuer(client, queue, nil).Enqueue(context.Background(), job.ID, "", time.Time{}))

		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "jobs", "cancel", job.ID)...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "canceled "+job.ID+"\n", r.out)
		got, err := b.store.Get(context.Background(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		_, err = insp.GetTaskInfo(queue, job.ID)
		require.ErrorIs(t, err, asynq.ErrTaskNotFound, "its task is gone")
		entries := auditLog(t, b.url)
		require.Len(t, entries, 1, "the cancel is in the audit log")
		require.Equal(t, "job.cancel", entries[0].Action)
		require.Equal(t, job.ID, entries[0].Target)
	})
	t.Run("Terminal", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, _, _ := redisArgs(t)
		job := b.createJob(t)
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "jobs", "cancel", job.ID)...)
		requireOneLineError(t, r, 1, "already ended: it is succeeded")
		require.Empty(t, r.out)
	})
	// A script that runs the cancel again (its first run's answer lost, or its exit 1 for an
	// abort Redis refused) learns that the job is canceled: exit 0, not "already ended".
	t.Run("AlreadyCanceled", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		job := b.createJob(t)
		r, expired := runTimeout(30*time.Second, "--database-url", b.url, "--redis-url", "redis://127.0.0.1:1/0", "jobs", "cancel", job.ID)
		require.False(t, expired)
		require.Equal(t, 1, r.code, "the abort Redis refused is the error")
		// Run again while Redis still refuses: canceled, but the abort it makes again is the
		// error (exit 1, run it again).
		r, expired = runTimeout(30*time.Second, "--database-url", b.url, "--redis-url", "redis://127.0.0.1:1/0", "jobs", "cancel", job.ID)
		require.False(t, expired)
		requireOneLineError(t, r, 1, "is canceled, but its task could not be aborted")
		require.Equal(t, job.ID+" was already canceled\n", r.out)
		redis, _, _ := redisArgs(t)
		r = run(t, append(append([]string{"--database-url", b.url}, redis...), "jobs", "cancel", job.ID)...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, job.ID+" was already canceled\n", r.out)
		require.Empty(t, r.errOut)
		require.Len(t, auditLog(t, b.url), 1, "audited once")
	})
	// The first run's cancel committed but its abort was never made (its answer lost, the
	// process killed): the job's task is still in Redis. Run again, it aborts it. It exited 0
	// and left the task.
	t.Run("AlreadyCanceledAbortsItsTask", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, insp, queue := redisArgs(t)
		job := b.createJob(t)
		opt, err := dispatch.RedisConnOpt(redisArgsURL(redis))
		require.NoError(t, err)
		client := asynq.NewClient(opt)
		defer client.Close()
		require.NoError(t, dispatch.NewEnqueuer(client, queue, nil).Enqueue(context.Background(), job.ID, "", time.Time{}))
		_, err = b.store.Cancel(context.Background(), job.ID) // the first run: committed, no abort
		require.NoError(t, err)

		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "jobs", "cancel", job.ID)...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, job.ID+" was already canceled\n", r.out)
		_, err = insp.GetTaskInfo(queue, job.ID)
		require.ErrorIs(t, err, asynq.ErrTaskNotFound, "its task is gone")
		require.Empty(t, auditLog(t, b.url), "nothing audited: the run changed nothing")
	})
	t.Run("Unknown", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, _, _ := redisArgs(t)
		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "jobs", "cancel", "nope")...)
		requireOneLineError(t, r, 1, `no job "nope"`)
	})
	t.Run("RedisUnreachable", func(t *testing.T) {
		// The cancel is Postgres's, as the API's and the console's are: a Redis outage does not
		// keep an operator from stopping a job (an attempt in flight finds it canceled at its
		// lease's next renewal). The abort that could not be made is the error.
		t.Parallel()
		b := setupJobs(t)
		job := b.createJob(t)
		r, expired := runTimeout(30*time.Second, "--database-url", b.url, "--redis-url", "redis://127.0.0.1:1/0", "jobs", "cancel", job.ID)
		require.False(t, expired)
		got, err := b.store.Get(context.Background(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		require.Equal(t, "canceled "+job.ID+"\n", r.out)
		require.Equal(t, 1, r.code, "stderr %q", r.errOut)
		require.Contains(t, r.errOut, "is canceled, but its task could not be aborted")
		require.Contains(t, r.errOut, "redis unreachable")
		require.Len(t, auditLog(t, b.url), 1, "the cancel is in the audit log")
	})
	t.Run("Usage", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", unreachableURL, "jobs", "cancel")
		requireOneLineError(t, r, 2, "usage")
	})
}

// redisArgsURL returns the --redis-url value of redisArgs' flags.
func redisArgsURL(args []string) string { return args[1] }

// TestJobsShow_Usage: `ctl jobs show` shows what the provider counted: the job's usage (its
// answer's) and each attempt's, a failed one's too; --json carries both. The table had none,
// though both are recorded: an operator asking what a job cost reached for psql.
func TestJobsShow_Usage(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	ctx := context.Background()
	job := b.createJob(t)
	for n, o := range []jobs.Outcome{
		{Status: jobs.StatusRetrying, LastError: &jobs.LastError{Class: "server", Status: 500, Message: "cut"}},
		{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`), Usage: json.RawMessage(`{"input_tokens":120,"output_tokens":45}`)},
	} {
		_, err := b.store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		a := &jobs.Attempt{Number: n + 1, Credential: "default", StartedAt: time.Now(), Latency: time.Millisecond, StatusCode: 200, Class: "ok"}
		if n == 0 {
			a.StatusCode, a.Class = 500, "server"
			a.Usage = json.RawMessage(`{"input_tokens":120,"output_tokens":7,"cache_read_input_tokens":100}`)
		}
		applied, err := b.store.Finish(ctx, job.ID, a, o)
		require.NoError(t, err)
		require.True(t, applied)
	}

	r := run(t, "--database-url", b.url, "jobs", "show", job.ID)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "120 in, 45 out", fields(r.out)["usage"])
	require.Regexp(t, `(?m)^ATTEMPT\s+STARTED\s+STATUS\s+CLASS\s+RETRY-AFTER\s+DELAY\s+LATENCY\s+USAGE$`, r.out)
	require.Regexp(t, `(?m)^1\s+\S+\s+500\s+server\s+-\s+-\s+1ms\s+120 in, 7 out, 100 cache read$`, r.out)
	require.Regexp(t, `(?m)^2\s+\S+\s+200\s+ok\s+-\s+-\s+1ms\s+120 in, 45 out$`, r.out)

	r = run(t, "--database-url", b.url, "jobs", "show", "--json", job.ID)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	var got struct {
		Job struct {
			Usage json.RawMessage `json:"usage"`
		} `json:"job"`
		Attempts []struct {
			Usage json.RawMessage `json:"usage"`
		} `json:"attempts"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &got))
	require.JSONEq(t, `{"input_tokens":120,"output_tokens":45}`, string(got.Job.Usage))
	require.Len(t, got.Attempts, 2)
	require.JSONEq(t, `{"input_tokens":120,"output_tokens":7,"cache_read_input_tokens":100}`, string(got.Attempts[0].Usage))
}

// TestUsageText_OutputUnreported: a stored usage whose output count the provider never
// reported (output_unreported, its output_tokens 0) says so rather than "0 out", which reads
// as an empty answer; a usage of the last release (no such key) and a reported 0 read as
// counts; a stored JSON null is no usage ("-"), as a NULL is.
func TestUsageText_OutputUnreported(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		`{"input_tokens":500,"output_tokens":0,"output_unreported":true}`:                               "500 in, output not reported",
		`{"input_tokens":500,"output_tokens":0,"output_unreported":true,"cache_read_input_tokens":100}`: "500 in, output not reported, 100 cache read",
		`{"input_tokens":500,"output_tokens":0}`:                                                        "500 in, 0 out",
		`{"input_tokens":120,"output_tokens":45}`:                                                       "120 in, 45 out",
		`null`:  "-",
		` null`: "-",
	} {
		require.Equal(t, want, usageText(json.RawMessage(raw)), raw)
	}
	require.Equal(t, "-", usageText(nil))
}

// TestUsageText_NothingCountedIsNone: a stored usage counting nothing, what a worker of the last
// release stored for an answer without a usage (workers now store none), read "0 in, 0 out", a
// cost the provider never reported: it reads "-", as the NULL a worker stores now does. A usage
// whose whole prompt is 0 (an output count without an input count) says its input was not
// reported, as output_unreported does for the output: no prompt is 0 tokens.
func TestUsageText_NothingCountedIsNone(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{`{"input_tokens":0,"output_tokens":0}`, `{}`} {
		require.Equal(t, "-", usageText(json.RawMessage(raw)), raw)
	}
	require.Equal(t, "input not reported, 3 out", usageText(json.RawMessage(`{"input_tokens":0,"output_tokens":3}`)),
		"an output count is a usage; its 0 input (no prompt is 0 tokens) is no count")
	require.Equal(t, "0 in, 3 out, 40 cache read", usageText(json.RawMessage(`{"input_tokens":0,"output_tokens":3,"cache_read_input_tokens":40}`)),
		"a prompt read from the cache alone")
}

// TestJobsShow_Tenant: `ctl jobs show` and `ctl dead show` name the job's tenant, in the table
// and in --json: on a shared deployment the operator learns whose job it is (whom to tell,
// whether `ctl dead retry` skips it as a revoked tenant's) without psql or the console.
func TestJobsShow_Tenant(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{
		Tenant: "acme", Credential: "default", Fingerprint: "x",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 1, Timeout: time.Minute,
	})
	require.NoError(t, err)
	dead := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)

	for _, c := range []struct{ cmd, id, tenant string }{{"jobs", job.ID, "acme"}, {"dead", dead.ID, "default"}} {
		r := run(t, "--database-url", b.url, c.cmd, "show", c.id)
		require.Equal(t, 0, r.code, "%s show: stderr %q", c.cmd, r.errOut)
		require.Equal(t, c.tenant, fields(r.out)["tenant"], "%s show: %q", c.cmd, r.out)

		r = run(t, "--database-url", b.url, c.cmd, "show", "--json", c.id)
		require.Equal(t, 0, r.code, "%s show --json: stderr %q", c.cmd, r.errOut)
		var got struct {
			Tenant string `json:"tenant"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
		require.Equal(t, c.tenant, got.Tenant, "%s show --json", c.cmd)
	}
}

// setTenant moves job id to tenant name (jobs name their tenant; no tenant row is needed).
func (b *jobsBundle) setTenant(t *testing.T, id, name string) {
	t.Helper()
	_, err := b.pool.Exec(t.Context(), `UPDATE jobs SET tenant = $1 WHERE id = $2`, name, id)
	require.NoError(t, err)
}

// jobTenants runs a job list with --json in args and returns its jobs as "ID TENANT".
func jobTenants(t *testing.T, args ...string) []string {
	t.Helper()
	r := run(t, args...)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	var list []struct {
		ID     string `json:"id"`
		Tenant string `json:"tenant"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &list), "output %q", r.out)
	out := []string{}
	for _, j := range list {
		out = append(out, j.ID+" "+j.Tenant)
	}
	return out
}

// TestJobsList_Tenant: `ctl jobs list` names each job's tenant (a column, and "tenant" in its
// JSON, which the API's job JSON leaves out) and filters by one with --tenant, as the console's
// jobs list does. It showed no tenant and could not filter by one. A tenant with no job (or
// none of that name) lists nothing, as the console's filter.
func TestJobsList_Tenant(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	own := b.createJob(t)
	acme := b.createJob(t)
	b.setTenant(t, acme.ID, "acme")

	t.Run("Table", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "jobs", "list")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows := tableRows(r.out)
		require.Equal(t, []string{"ID", "STATUS", "TENANT", "CREDENTIAL", "ATTEMPTS", "CREATED", "FINISHED"}, rows[0])
		require.Len(t, rows, 3)
		require.Equal(t, []string{acme.ID, "queued", "acme", "default"}, rows[1][:4])
		require.Equal(t, []string{own.ID, "queued", "default", "default"}, rows[2][:4])
	})
	t.Run("Filter", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "jobs", "list", "--tenant", "acme")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows := tableRows(r.out)
		require.Len(t, rows, 2, "output %q", r.out)
		require.Equal(t, acme.ID, rows[1][0])
		r = run(t, "--database-url", b.url, "jobs", "list", "--tenant", "default", "--status", "queued")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows = tableRows(r.out)
		require.Len(t, rows, 2, "output %q", r.out)
		require.Equal(t, own.ID, rows[1][0])
	})
	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, []string{acme.ID + " acme"}, jobTenants(t, "--database-url", b.url, "jobs", "list", "--json", "--tenant", "acme"))
	})
	t.Run("UnknownTenant", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "jobs", "list", "--tenant", "nobody")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "no jobs\n", r.out)
	})
	// --tenant "$T" with T unset would list every tenant's jobs as if they were one's.
	t.Run("EmptyTenant", func(t *testing.T) {
		t.Parallel()
		requireOneLineError(t, run(t, "--database-url", b.url, "jobs", "list", "--tenant", ""), 2, "--tenant: name a tenant")
		requireOneLineError(t, run(t, "--database-url", b.url, "dead", "list", "--tenant", " "), 2, "--tenant: name a tenant")
	})
}
