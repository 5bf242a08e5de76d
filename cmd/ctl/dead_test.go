package main

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// redisArgs returns the flags that point ctl at the test Redis and a fresh asynq queue, and an
// inspector on that queue; the queue's keys are removed when the test ends.
func redisArgs(t *testing.T) ([]string, *asynq.Inspector, string) {
	t.Helper()
	redistest.Client(t) // fails the test when Redis is down
	opt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	queue := redistest.Queue(t, redistest.URL()) // every key of the queue removed at the end
	insp := asynq.NewInspector(opt)
	t.Cleanup(func() { require.NoError(t, insp.Close()) })
	return []string{"--redis-url", redistest.URL(), "--queue", queue}, insp, queue
}

// attempt runs one attempt of the job, as the worker records it, ending in o.
func (b *jobsBundle) attempt(t *testing.T, id string, o jobs.Outcome) {
	t.Helper()
	ctx := context.Background()
	job, err := b.store.BeginAttempt(ctx, id)
	require.NoError(t, err)
	if o.LastError == nil && o.Status != jobs.StatusSucceeded {
		o.LastError = &jobs.LastError{Class: "server_error", Status: 503, Message: "overloaded"}
	}
	retryAfter := time.Second
	applied, err := b.store.Finish(ctx, id, &jobs.Attempt{
		Number: job.Attempts, Credential: job.Credential, StartedAt: time.Now(), Latency: 80 * time.Millisecond,
		StatusCode: 503, Class: "server_error", RetryAfter: &retryAfter, Error: "overloaded",
	}, o)
	require.NoError(t, err)
	require.True(t, applied)
}

// deadJob makes a job of credential cred that died with reason after n attempts.
func (b *jobsBundle) deadJob(t *testing.T, cred, reason string, n int) *jobs.Job {
	t.Helper()
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{
		Tenant: "default", Credential: cred, Fingerprint: "x",
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":5}`), MaxAttempts: n, Timeout: time.Minute,
	})
	require.NoError(t, err)
	for range n - 1 {
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	}
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: reason})
	return job
}

// tableRows returns the rows of a table output (header first), split on runs of 2+ spaces.
func tableRows(out string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		var cells []string
		for _, c := range strings.Split(line, "  ") {
			if c = strings.TrimSpace(c); c != "" {
				cells = append(cells, c)
			}
		}
		rows = append(rows, cells)
	}
	return rows
}

func TestDeadList(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	exhausted := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 3)
	capped := b.deadJob(t, "other", jobs.ReasonRateLimitedNoRetryAfter, 1)
	b.createJob(t) // queued: not listed

	t.Run("Table", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "list")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Empty(t, r.errOut)
		rows := tableRows(r.out)
		require.Equal(t, []string{"ID", "TENANT", "CREDENTIAL", "REASON", "ATTEMPTS", "DIED", "LAST ERROR"}, rows[0])
		require.Len(t, rows, 3)
		require.Equal(t, []string{capped.ID, "default", "other", "rate_limited_no_retry_after", "1/1"}, rows[1][:5])
		require.Equal(t, []string{exhausted.ID, "default", "default", "retries_exhausted", "3/3"}, rows[2][:5])
		require.Equal(t, "server_error 503: overloaded", rows[2][6])
	})
	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "list", "--json")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		var got []struct {
			ID         string `json:"id"`
			Status     string `json:"status"`
			DeadReason string `json:"dead_reason"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
		require.Len(t, got, 2)
		require.Equal(t, capped.ID, got[0].ID)
		require.Equal(t, "dead", got[1].Status)
		require.Equal(t, "retries_exhausted", got[1].DeadReason)
	})
	t.Run("Filters", func(t *testing.T) {
		t.Parallel()
		for name, tc := range map[string]struct {
			args []string
			want []string
		}{
			"Reason":     {[]string{"--reason", "retries_exhausted"}, []string{exhausted.ID}},
			"Credential": {[]string{"--credential", "other"}, []string{capped.ID}},
			"Since":      {[]string{"--since", "1h"}, []string{capped.ID, exhausted.ID}},
			"SinceDays":  {[]string{"--since", "7d"}, []string{capped.ID, exhausted.ID}},
			"Limit":      {[]string{"--limit", "1"}, []string{capped.ID}},
			"NoMatch":    {[]string{"--credential", "nope"}, []string{}},
		} {
			r := run(t, append([]string{"--database-url", b.url, "dead", "list", "--json"}, tc.args...)...)
			require.Equal(t, 0, r.code, "%s: stderr %q", name, r.errOut)
			var got []struct {
				ID string `json:"id"`
			}
			require.NoError(t, json.Unmarshal([]byte(r.out), &got))
			ids := []string{}
			for _, g := range got {
				ids = append(ids, g.ID)
			}
			require.Equal(t, tc.want, ids, name)
		}
	})
	t.Run("EmptyTable", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "list", "--credential", "nope")
		require.Equal(t, 0, r.code)
		require.Equal(t, "no dead jobs\n", r.out)
	})
	t.Run("BadSince", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "list", "--since", "yesterday")
		requireOneLineError(t, r, 2, "--since")
	})
}

func TestDeadShow(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 2)

	t.Run("Table", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "show", job.ID)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows := fields(r.out)
		require.Equal(t, "dead", rows["status"])
		require.Equal(t, "claude-test", rows["model"])
		require.Equal(t, "2/2", rows["attempts"])
		require.Equal(t, "retries_exhausted", rows["dead reason"])
		require.Equal(t, "38", rows["request bytes"])
		require.Regexp(t, `(?m)^ATTEMPT\s+STARTED\s+STATUS\s+CLASS\s+RETRY-AFTER\s+DELAY\s+LATENCY\s+USAGE$`, r.out)
		require.Regexp(t, `(?m)^1\s+\S+\s+503\s+server_error\s+1s\s+-\s+80ms\s+-$`, r.out)
		require.Regexp(t, `(?m)^2\s+\S+\s+503\s+server_error\s+1s\s+-\s+80ms\s+-$`, r.out)
	})
	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "show", "--json", job.ID)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		var got struct {
			Job struct {
				ID         string `json:"id"`
				DeadReason string `json:"dead_reason"`
			} `json:"job"`
			Request struct {
				Bytes int    `json:"bytes"`
				Model string `json:"model"`
			} `json:"request"`
			Attempts []jobs.AttemptRow `json:"attempts"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
		require.Equal(t, job.ID, got.Job.ID)
		require.Equal(t, "retries_exhausted", got.Job.DeadReason)
		require.Equal(t, 38, got.Request.Bytes)
		require.Equal(t, "claude-test", got.Request.Model)
		require.Len(t, got.Attempts, 2)
		require.Equal(t, 2, got.Attempts[1].Number)
		require.EqualValues(t, 1000, *got.Attempts[1].RetryAfterMS)
		require.InDelta(t, 80, got.Attempts[1].LatencyMS, 0.01)
	})
	t.Run("NotDead", func(t *testing.T) {
		t.Parallel()
		live := b.createJob(t)
		r := run(t, "--database-url", b.url, "dead", "show", live.ID)
		requireOneLineError(t, r, 1, "is queued, not dead")
	})
	t.Run("Unknown", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "show", "0190a5b2-7c1e-7d3f-9a8b-123456789abc")
		requireOneLineError(t, r, 1, "no job")
	})
}

func TestDeadRetry(t *testing.T) {
	t.Parallel()

	t.Run("IDs", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, insp, queue := redisArgs(t)
		job := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 2)

		// An ID in capitals names its job too; given twice, it is one job.
		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", strings.ToUpper(job.ID), job.ID)...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "requeued "+job.ID+"\n", r.out)

		got, err := b.store.Get(context.Background(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, got.Status)
		require.Equal(t, 0, got.Attempts)
		info, err := insp.GetTaskInfo(queue, job.ID)
		require.NoError(t, err)
		require.Equal(t, asynq.TaskStatePending, info.State)

		// The next round's attempts continue the numbering; the old ones stay.
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})
		attempts, err := b.store.Attempts(context.Background(), job.ID)
		require.NoError(t, err)
		require.Len(t, attempts, 3)
		require.Equal(t, 3, attempts[2].Number)
		evs, err := b.store.Events(context.Background(), job.ID, 0)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, evs[5].Type, "the retry appended an event")

		entries := auditLog(t, b.url)
		require.Len(t, entries, 1, "the retry is in the audit log")
		require.Equal(t, "dead.retry", entries[0].Action)
		require.Equal(t, job.ID, entries[0].Target)
		require.Equal(t, 1, entries[0].Count)
		require.Equal(t, map[string]any{"requested": []any{job.ID}}, entries[0].Detail)
		require.True(t, strings.HasPrefix(entries[0].Operator, "ctl"), entries[0].Operator)
	})

	t.Run("AllByReason", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, insp, queue := redisArgs(t)
		capped1 := b.deadJob(t, "default", jobs.ReasonRateLimitedNoRetryAfter, 1)
		capped2 := b.deadJob(t, "default", jobs.ReasonRateLimitedNoRetryAfter, 1)
		exhausted := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)

		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", "--all", "--reason", jobs.ReasonRateLimitedNoRetryAfter)...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "requeued 2 dead jobs\n", r.out)
		for _, id := range []string{capped1.ID, capped2.ID} {
			_, err := insp.GetTaskInfo(queue, id)
			require.NoError(t, err)
		}
		still, err := b.store.Get(context.Background(), exhausted.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, still.Status)

		r = run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", "--all", "--reason", jobs.ReasonRateLimitedNoRetryAfter)...)
		require.Equal(t, 0, r.code)
		require.Equal(t, "no dead jobs matched\n", r.out)

		entries := auditLog(t, b.url)
		require.Len(t, entries, 2, "both retries are in the audit log, the one that matched nothing too")
		require.Equal(t, 0, entries[0].Count)
		require.Equal(t, 2, entries[1].Count)
		require.Empty(t, entries[1].Target, "several jobs")
		require.Equal(t, map[string]any{"all": true, "reason": jobs.ReasonRateLimitedNoRetryAfter, "credential": ""}, entries[1].Detail)
	})

	// The jobs a worker dead-lettered because their credential was in no config (removed or
	// renamed by mistake) are put back by their reason once it is restored.
	t.Run("AllOfACredentialNotConfigured", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, insp, queue := redisArgs(t)
		unconfigured := b.deadJob(t, "default", jobs.ReasonCredentialNotConfigured, 1)
		exhausted := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)

		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", "--all", "--reason",
			jobs.ReasonCredentialNotConfigured)...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "requeued 1 dead jobs\n", r.out)
		_, err := insp.GetTaskInfo(queue, unconfigured.ID)
		require.NoError(t, err)
		got, err := b.store.Get(context.Background(), unconfigured.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, got.Status)
		still, err := b.store.Get(context.Background(), exhausted.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, still.Status)
	})

	// A long run goes in batches, each committed and enqueued before the next, and tells its
	// progress after each.
	t.Run("AllTellsProgress", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, insp, queue := redisArgs(t)
		const n = deadRetryBatch + 1
		_, err := b.pool.Exec(context.Background(), `INSERT INTO jobs (id, credential, fingerprint, status, request,
	max_attempts, timeout_ms, deadline, dead_reason, finished_at)
SELECT gen_random_uuid(), 'default', 'f', 'dead', '{}', 3, 60000, now(), 'retries_exhausted', now() - g * interval '1 second'
FROM generate_series(1, $1::int) g`, n)
		require.NoError(t, err)

		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", "--all")...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "requeued 500 dead jobs so far\nrequeued 501 dead jobs\n", r.out)
		info, err := insp.GetQueueInfo(queue)
		require.NoError(t, err)
		require.Equal(t, n, info.Pending, "every job's task is enqueued")
		entries := auditLog(t, b.url)
		require.Len(t, entries, 1)
		require.Equal(t, n, entries[0].Count)
	})

	t.Run("NotDeadAndUnknown", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		redis, _, _ := redisArgs(t)
		dead := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
		live := b.createJob(t)
		const unknown = "0190a5b2-7c1e-7d3f-9a8b-123456789abc"

		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", dead.ID, live.ID, unknown)...)
		requireOneLineError(t, r, 1, "job "+live.ID+" is queued, not dead")
		require.Contains(t, r.errOut, `no job "`+unknown+`"`)
		require.Equal(t, "requeued "+dead.ID+"\n", r.out, "the dead one is requeued anyway")
	})

	t.Run("Usage", func(t *testing.T) {
		t.Parallel()
		for name, args := range map[string][]string{
			"Nothing":          {"dead", "retry"},
			"IDsAndAll":        {"dead", "retry", "--all", "x"},
			"ReasonWithoutAll": {"dead", "retry", "--reason", "r", "x"},
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				r := run(t, append([]string{"--database-url", unreachableURL}, args...)...)
				requireOneLineError(t, r, 2, "")
			})
		}
	})

	t.Run("RedisUnreachable", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		job := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
		r, expired := runTimeout(30*time.Second, "--database-url", b.url, "--redis-url", "redis://127.0.0.1:1/0", "dead", "retry", job.ID)
		require.False(t, expired)
		requireOneLineError(t, r, 1, "redis unreachable")
		got, err := b.store.Get(context.Background(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusDead, got.Status, "nothing changed")
	})
}

func TestDeadPurge(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	old := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	recent := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	_, err := b.pool.Exec(context.Background(), `UPDATE jobs SET finished_at = now() - interval '10 days' WHERE id = $1`, old.ID)
	require.NoError(t, err)

	r := run(t, "--database-url", b.url, "dead", "purge", "--older-than", "7d")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "purged 1 dead jobs\n", r.out)
	_, err = b.store.Get(context.Background(), old.ID)
	require.ErrorIs(t, err, jobs.ErrNotFound)
	_, err = b.store.Get(context.Background(), recent.ID)
	require.NoError(t, err)
	entries := auditLog(t, b.url)
	require.Len(t, entries, 1, "the purge is in the audit log")
	require.Equal(t, "dead.purge", entries[0].Action)
	require.Equal(t, 1, entries[0].Count)
	require.Equal(t, map[string]any{"older_than": "168h0m0s"}, entries[0].Detail)

	r = run(t, "--database-url", b.url, "dead", "purge")
	requireOneLineError(t, r, 2, "usage: ctl dead purge ID... | --older-than D")
	// 300000 days overflow a Duration; 1e-20d is less than a nanosecond: no bound at all.
	for _, age := range []string{"300000d", "0d", "-1h", "Infd", "NaNd", "1e-20d", "99999999h"} {
		r = run(t, "--database-url", b.url, "dead", "purge", "--older-than", age)
		requireOneLineError(t, r, 2, "want a positive duration such as 30m, 24h or 7d, at most 106751d")
	}
	r = run(t, "--database-url", b.url, "dead", "purge", recent.ID, "--older-than", "7d")
	requireOneLineError(t, r, 2, "usage: ctl dead purge ID... | --older-than D")

	// By IDs: the dead one goes, a live job and an unknown ID are named and left alone.
	live := b.createJob(t)
	const unknown = "0190a5b2-7c1e-7d3f-9a8b-123456789abc"
	r = run(t, "--database-url", b.url, "dead", "purge", strings.ToUpper(recent.ID), live.ID, unknown)
	requireOneLineError(t, r, 1, "job "+live.ID+" is queued, not dead")
	require.Contains(t, r.errOut, `no job "`+unknown+`"`)
	require.Equal(t, "purged "+recent.ID+"\n", r.out)
	_, err = b.store.Get(context.Background(), recent.ID)
	require.ErrorIs(t, err, jobs.ErrNotFound)
	_, err = b.store.Get(context.Background(), live.ID)
	require.NoError(t, err, "the live job stays")
	entries = auditLog(t, b.url)
	require.Len(t, entries, 2)
	require.Equal(t, "dead.purge", entries[0].Action)
	require.Equal(t, 1, entries[0].Count)
	require.Equal(t, map[string]any{"requested": []any{recent.ID, live.ID, unknown}}, entries[0].Detail)
}

// TestDeadList_FailedOverJob: a job that failed over and died on its fallback is listed with
// the credential it died on (the one its alert names and that is paused), and its own, and
// either --credential finds it. The table named only its own credential, and --credential
// with the fallback found nothing.
func TestDeadList_FailedOverJob(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job, _, err := b.store.Create(t.Context(), jobs.CreateParams{
		Tenant: "default", Credential: "default", Fallbacks: []string{"backup"}, Fingerprint: "x",
		Request: json.RawMessage(`{"model":"claude-test","max_tokens":5}`), MaxAttempts: 3, Timeout: time.Minute,
	})
	require.NoError(t, err)
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying, NextCredential: true})
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRateLimitedNoRetryAfter})

	for _, cred := range []string{"backup", "default"} {
		r := run(t, "--database-url", b.url, "dead", "list", "--credential", cred)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows := tableRows(r.out)
		require.Len(t, rows, 2, "--credential %s: %q", cred, r.out)
		require.Equal(t, []string{job.ID, "default", "backup (from default)"}, rows[1][:3])
	}
}

// TestDead_CutoffsOnPostgresClock: --since and --older-than count back from Postgres's now(),
// the clock that wrote finished_at (a host 3 days ahead, counting back from its own clock,
// purged under --older-than 7d a job that died 5 days ago). That no host clock is read at all is
// TestCtl_ReadsNoHostClock's.
func TestDead_CutoffsOnPostgresClock(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	_, err := b.pool.Exec(context.Background(), `UPDATE jobs SET finished_at = now() - interval '5 days' WHERE id = $1`, job.ID)
	require.NoError(t, err)

	r := run(t, "--database-url", b.url, "dead", "list", "--json", "--since", "7d")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	var got []struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
	require.Len(t, got, 1, "the job died 5 days ago on Postgres's clock")

	r = run(t, "--database-url", b.url, "dead", "list", "--json", "--since", "4d")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.JSONEq(t, "[]", r.out, "the job died more than 4 days ago")

	r = run(t, "--database-url", b.url, "dead", "purge", "--older-than", "7d")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "purged 0 dead jobs\n", r.out, "the job is younger than 7 days")

	r = run(t, "--database-url", b.url, "dead", "purge", "--older-than", "4d")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "purged 1 dead jobs\n", r.out, "the job is older than 4 days")
}

// TestCtl_ReadsNoHostClock: ctl compares its cutoffs and windows with timestamps Postgres's
// now() wrote, so it takes them from Postgres (jobs.Store.Ago, Stats); a cutoff taken from
// the operator's host moves by that host's offset (one 3 days ahead purged dead letters younger
// than asked). No file of ctl's but its tests may read the host's clock.
func TestCtl_ReadsNoHostClock(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	read := 0
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		read++
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "time" && slices.Contains([]string{"Now", "Since", "Until"}, sel.Sel.Name) {
				t.Errorf("%s reads the host's clock (time.%s): take the time from Postgres", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
	require.NotZero(t, read, "no Go file of ctl's read")
}

// TestDead_AMalformedIDIsNamedSo: `dead retry` and `dead purge` name an argument that is not in
// the form of a job ID as such (a typo, a truncated copy), and act on the others. It was
// reported `no job "..."`, as if a job of that ID had been purged.
func TestDead_AMalformedIDIsNamedSo(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	redis, _, _ := redisArgs(t)
	for _, action := range []string{"retry", "purge"} {
		job := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
		truncated := job.ID[:35]
		r := run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", action, job.ID, truncated)...)
		requireOneLineError(t, r, 1, fmt.Sprintf("%q is not a job ID", truncated))
		require.Contains(t, r.out, job.ID, action)
	}
}

// TestDeadList_PagesWithAfter: --after ID goes on from the dead job of that ID, so that every
// dead letter can be listed, a page at a time, however many there are.
func TestDeadList_PagesWithAfter(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	var want []string // most recently dead first
	for range 5 {
		want = append([]string{b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1).ID}, want...)
	}
	b.createJob(t) // queued: not listed

	var got []string
	after := ""
	for page := 0; page < 5; page++ {
		args := []string{"--database-url", b.url, "dead", "list", "--limit", "2", "--json"}
		if after != "" {
			args = append(args, "--after", after)
		}
		r := run(t, args...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		var list []struct {
			ID string `json:"id"`
		}
		require.NoError(t, json.Unmarshal([]byte(r.out), &list), "output %q", r.out)
		if len(list) == 0 {
			break
		}
		for _, j := range list {
			got = append(got, j.ID)
		}
		after = list[len(list)-1].ID
	}
	require.Equal(t, want, got)

	t.Run("TableTellsTheNextPage", func(t *testing.T) {
		r := run(t, "--database-url", b.url, "dead", "list", "--limit", "2")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		lines := strings.Split(strings.TrimRight(r.out, "\n"), "\n")
		require.Len(t, lines, 4, "header, two jobs, the next page: %q", r.out)
		require.Equal(t, "next page: ctl --database-url '"+b.url+"' dead list --limit 2 --after "+want[1], lines[3])
		r = run(t, "--database-url", b.url, "dead", "list", "--limit", "2", "--after", want[3])
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Len(t, tableRows(r.out), 2, "the last page, without a next: %q", r.out)
		require.Equal(t, want[4], tableRows(r.out)[1][0])
	})
	t.Run("AfterAJobNotDead", func(t *testing.T) {
		queued := b.createJob(t)
		r := run(t, "--database-url", b.url, "dead", "list", "--after", queued.ID)
		requireOneLineError(t, r, 1, "--after "+queued.ID+": the job is queued, not dead")
		r = run(t, "--database-url", b.url, "dead", "list", "--after", "nope")
		requireOneLineError(t, r, 2, `--after "nope": want the ID of a dead job`)
	})
}

// TestDeadRetry_SkipsRevokedTenants: a retry leaves a revoked tenant's dead letters dead, and
// says so: how many with --all, which and why by ID.
func TestDeadRetry_SkipsRevokedTenants(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	redis, _, _ := redisArgs(t)
	gone := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	live := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	_, err := b.pool.Exec(t.Context(), `INSERT INTO tenants (name, token_sha256, revoked_at) VALUES ('gone', sha256('gone'), now())`)
	require.NoError(t, err)
	_, err = b.pool.Exec(t.Context(), `UPDATE jobs SET tenant = 'gone' WHERE id = $1`, gone.ID)
	require.NoError(t, err)

	r := run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", gone.ID)...)
	requireOneLineError(t, r, 1, "job "+gone.ID+" was left dead: its tenant is revoked")

	// A job of a tenant not revoked that died after the retry began is left dead too (a retry
	// takes the jobs dead when it began): not for its tenant.
	later := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	_, err = b.pool.Exec(t.Context(), `UPDATE jobs SET finished_at = now() + interval '1 hour' WHERE id = $1`, later.ID)
	require.NoError(t, err)
	r = run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", later.ID)...)
	requireOneLineError(t, r, 1, "job "+later.ID+" was left dead: it died after the retry began; run it again")
	_, err = b.pool.Exec(t.Context(), `UPDATE jobs SET finished_at = now() - interval '1 hour' WHERE id = $1`, later.ID)
	require.NoError(t, err)

	r = run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", "--all")...)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "requeued 2 dead jobs\nskipped 1 dead jobs of revoked tenants ("+revokedDeadNote+")\n", r.out)
	entries := auditLog(t, b.url)
	require.Equal(t, float64(1), entries[0].Detail["skipped_revoked"], "the audit entry counts them")
	for id, want := range map[string]jobs.Status{gone.ID: jobs.StatusDead, live.ID: jobs.StatusQueued, later.ID: jobs.StatusQueued} {
		got, err := b.store.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, want, got.Status)
	}
}

// TestDeadList_HelpSaysHowToPageJSON: `ctl dead list --json` prints no next-page marker (a
// script pages with the last job's id as --after, until an empty array), and its help says so,
// as docs/operations.md does. Neither said how a script pages (TestDeadList_PagesWithAfter
// pages so).
func TestDeadList_HelpSaysHowToPageJSON(t *testing.T) {
	t.Parallel()
	r := run(t, "dead", "list", "--help")
	require.Equal(t, 0, r.code, r.errOut)
	help := strings.Join(strings.Fields(r.out), " ")
	require.Contains(t, help, "--json print JSON: an array of at most --limit jobs, without a next-page marker: "+
		"the next page is --after the last job's id; an empty array is the end")
	ops, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	require.NoError(t, err)
	require.Contains(t, string(ops), "ctl dead list --json --limit 100 --after LAST_ID")
}

// TestDeadList_NextPageKeepsTheDatabase: the next page's command line, run as printed, lists the
// next page of the same database. It named the filters only: after `ctl --config prod.yaml dead
// list`, it ran against the default database (or another deployment's), and failed "no such
// job" or listed another's dead letters.
func TestDeadList_NextPageKeepsTheDatabase(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	var want []string // most recently dead first
	for range 3 {
		want = append([]string{b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1).ID}, want...)
	}
	cfgFile := configFile(t, b.url, "default", "anthropic")
	for name, global := range map[string][]string{
		"Config":      {"--config", cfgFile},
		"DatabaseURL": {"--database-url", b.url, "--timeout", "20s"},
	} {
		t.Run(name, func(t *testing.T) {
			r := run(t, append(global, "dead", "list", "--limit", "2")...)
			require.Equal(t, 0, r.code, "stderr %q", r.errOut)
			lines := strings.Split(strings.TrimRight(r.out, "\n"), "\n")
			next, ok := strings.CutPrefix(lines[len(lines)-1], "next page: ")
			require.True(t, ok, "output %q", r.out)
			args := shellWords(t, next)
			require.Equal(t, "ctl", args[0], next)
			require.Equal(t, global, args[1:1+len(global)], next)
			r = run(t, args[1:]...)
			require.Equal(t, 0, r.code, "%s: stderr %q", next, r.errOut)
			rows := tableRows(r.out)
			require.Len(t, rows, 2, "header and the last job: %q", r.out)
			require.Equal(t, want[2], rows[1][0])
		})
	}
}

// shellWords splits s as a POSIX shell splits a command line of plain words and single-quoted
// ones (the quoting of shellQuote).
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case quoted && r == '\'':
			quoted = false
		case quoted:
			w.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == '\\':
			t.Fatalf("a backslash outside quotes in %q", s)
		case r == ' ':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	require.False(t, quoted, "an unclosed quote in %q", s)
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// TestStoreArgs_MaskThePassword: a next page's command line never prints a database password.
func TestStoreArgs_MaskThePassword(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u:s3cret@db:5432/llmq":           "postgres://u:xxxxx@db:5432/llmq",
		"postgres://u@db/llmq?sslmode=disable":       "postgres://u@db/llmq?sslmode=disable",
		"host=db user=u password=s3cret dbname=llmq": "host=db user=u password=xxxxx dbname=llmq",
		"host=db password='s3 cret' dbname=llmq":     "host=db password=xxxxx dbname=llmq",
	} {
		require.Equal(t, want, maskPassword(in), in)
	}
	require.Equal(t, `'it'\''s here/llmq.yaml'`, shellQuote("it's here/llmq.yaml"))
	require.Equal(t, "/etc/llmq/prod.yaml", shellQuote("/etc/llmq/prod.yaml"))
}

// TestDeadList_TheLargestLimit: --limit up to the largest integer lists every dead job, as
// `jobs list` and `audit` do; the read of one row more than the limit (to tell a next page)
// overflowed, and Postgres answered "LIMIT must not be negative".
func TestDeadList_TheLargestLimit(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	r := run(t, "--database-url", b.url, "dead", "list", "--limit", strconv.Itoa(math.MaxInt))
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	rows := tableRows(r.out)
	require.Len(t, rows, 2, "header and the job, no next page: %q", r.out)
	require.Equal(t, job.ID, rows[1][0])
}

// TestDeadList_Tenant: `ctl dead list` names each dead job's tenant (a column, and "tenant" in
// its JSON) and filters by one with --tenant; its next page's command line keeps --tenant, so
// the next page is the same tenant's. It showed no tenant and could not filter by one.
func TestDeadList_Tenant(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	var acme []string // most recently dead first
	for range 3 {
		id := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1).ID
		b.setTenant(t, id, "acme")
		acme = append([]string{id}, acme...)
	}
	own := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)

	t.Run("Table", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "list")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows := tableRows(r.out)
		require.Equal(t, []string{"ID", "TENANT", "CREDENTIAL", "REASON", "ATTEMPTS", "DIED", "LAST ERROR"}, rows[0])
		require.Len(t, rows, 5)
		require.Equal(t, []string{own.ID, "default", "default", "retries_exhausted"}, rows[1][:4])
		require.Equal(t, []string{acme[0], "acme", "default", "retries_exhausted"}, rows[2][:4])
	})
	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, []string{own.ID + " default"}, jobTenants(t, "--database-url", b.url, "dead", "list", "--json", "--tenant", "default"))
	})
	t.Run("NextPageKeepsTheTenant", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "list", "--tenant", "acme", "--limit", "2")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		lines := strings.Split(strings.TrimRight(r.out, "\n"), "\n")
		require.Len(t, lines, 4, "header, two jobs, the next page: %q", r.out)
		require.Equal(t, "next page: ctl --database-url '"+b.url+"' dead list --tenant acme --limit 2 --after "+acme[1], lines[3])
		next, _ := strings.CutPrefix(lines[3], "next page: ")
		r = run(t, shellWords(t, next)[1:]...)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		rows := tableRows(r.out)
		require.Len(t, rows, 2, "the last of acme's, not default's: %q", r.out)
		require.Equal(t, acme[2], rows[1][0])
	})
	t.Run("UnknownTenant", func(t *testing.T) {
		t.Parallel()
		r := run(t, "--database-url", b.url, "dead", "list", "--tenant", "nobody")
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "no dead jobs\n", r.out)
	})
}

// TestDeadPurge_TellsProgress: `ctl dead purge --older-than` deletes in batches of
// jobs.PurgeDeadBatch, each committed on its own, and tells its progress after each, as `dead
// retry --all` does. It said nothing until the last batch, however many thousands it deleted.
func TestDeadPurge_TellsProgress(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	const n = jobs.PurgeDeadBatch + 1
	insertOldDeadJobs(t, b.pool, n)

	r := run(t, "--database-url", b.url, "dead", "purge", "--older-than", "7d")
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "purged 500 dead jobs so far\npurged 501 dead jobs\n", r.out)
	var left int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM jobs`).Scan(&left))
	require.Zero(t, left)
	entries := auditLog(t, b.url)
	require.Len(t, entries, 1)
	require.Equal(t, n, entries[0].Count)
}

// TestDeadRetry_AllTenant: `ctl dead retry --all --tenant T` puts back only T's dead jobs, as
// `ctl dead list --tenant T` lists only them; an empty --tenant, or --tenant without --all, is a
// usage error. --all took no --tenant: an operator retrying one tenant's dead letters retried
// every tenant's.
func TestDeadRetry_AllTenant(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	redis, insp, queue := redisArgs(t)
	mine := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	other := b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1)
	_, err := b.pool.Exec(t.Context(), `UPDATE jobs SET tenant = 'acme' WHERE id = $1`, mine.ID)
	require.NoError(t, err)

	for _, args := range [][]string{{"--all", "--tenant", ""}, {"--all", "--tenant", "  "}} {
		r := run(t, append(append([]string{"--database-url", b.url}, redis...), append([]string{"dead", "retry"}, args...)...)...)
		requireOneLineError(t, r, 2, "--tenant: name a tenant")
	}
	r := run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", mine.ID, "--tenant", "acme")...)
	requireOneLineError(t, r, 2, "--reason, --credential and --tenant go with --all")

	r = run(t, append(append([]string{"--database-url", b.url}, redis...), "dead", "retry", "--all", "--tenant", "acme")...)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	require.Equal(t, "requeued 1 dead jobs\n", r.out)
	got, err := b.store.Get(t.Context(), mine.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)
	_, err = insp.GetTaskInfo(queue, mine.ID)
	require.NoError(t, err)
	still, err := b.store.Get(t.Context(), other.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusDead, still.Status, "another tenant's dead job is left dead")
	entries := auditLog(t, b.url)
	require.Len(t, entries, 1)
	require.Equal(t, "acme", entries[0].Detail["tenant"])
}

// TestDeadPurge_StoppedHalfwaySaysAndAuditsWhatItDeleted: a purge whose second batch fails (a
// trigger raising on the second delete of jobs: Postgres failing mid-purge) keeps the first
// batch's deletion, says how many it deleted (exit 1) and writes the audit entry for them; the
// second batch's jobs stay.
func TestDeadPurge_StoppedHalfwaySaysAndAuditsWhatItDeleted(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	const n = jobs.PurgeDeadBatch + 1
	insertOldDeadJobs(t, b.pool, n)
	_, err := b.pool.Exec(t.Context(), `CREATE SEQUENCE purge_deletes;
CREATE FUNCTION fail_second_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF nextval('purge_deletes') > 1 THEN
		RAISE EXCEPTION 'injected: the second delete fails';
	END IF;
	RETURN NULL;
END $$;
CREATE TRIGGER fail_second_delete BEFORE DELETE ON jobs FOR EACH STATEMENT EXECUTE FUNCTION fail_second_delete()`)
	require.NoError(t, err)

	r := run(t, "--database-url", b.url, "dead", "purge", "--older-than", "7d")
	requireOneLineError(t, r, 1, "purge stopped after 500 jobs")
	require.Contains(t, r.errOut, "injected: the second delete fails")
	require.Equal(t, "purged 500 dead jobs so far\n", r.out)
	var left int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM jobs`).Scan(&left))
	require.Equal(t, n-jobs.PurgeDeadBatch, left, "the first batch's deletion stands; the second's jobs stay")
	entries := auditLog(t, b.url)
	require.Len(t, entries, 1)
	require.Equal(t, "dead.purge", entries[0].Action)
	require.Equal(t, jobs.PurgeDeadBatch, entries[0].Count)
}

// insertOldDeadJobs stores n dead jobs that died ten days ago and more, a second apart.
func insertOldDeadJobs(t *testing.T, pool *pgxpool.Pool, n int) {
	t.Helper()
	_, err := pool.Exec(t.Context(), `INSERT INTO jobs (id, credential, fingerprint, status, request,
	max_attempts, timeout_ms, deadline, dead_reason, finished_at)
SELECT gen_random_uuid(), 'default', 'f', 'dead', '{}', 3, 60000, now(), 'retries_exhausted', now() - interval '10 days' - g * interval '1 second'
FROM generate_series(1, $1::int) g`, n)
	require.NoError(t, err)
}
