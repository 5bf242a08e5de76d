package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
)

// stallOn returns the URL of a Redis that answers every command but those that name one of
// ids (a job's task: looked up, signaled, enqueued), which it never answers: a Redis stalled
// after ctl's first ping. The stall ends when the test does.
func stallOn(t *testing.T, ids ...string) string {
	t.Helper()
	redistest.Client(t) // fails the test when Redis is down
	release := make(chan struct{})
	p := redistest.NewProxy(t, func(_ *redistest.ProxyConn, b []byte) {
		for _, id := range ids {
			if bytes.Contains(b, []byte(id)) {
				<-release
			}
		}
	}, nil)
	t.Cleanup(func() { close(release) }) // before the proxy's own cleanup: it waits for its hooks
	return p.URL()
}

// TestCtl_RedisStallIsBounded: an operator's command whose Redis stops answering after ctl's
// first ping fails within seconds, naming Redis, with what it did in Postgres kept: it does not
// wait for each of its Redis commands' timeouts and retries in turn (a minute a job).
func TestCtl_RedisStallIsBounded(t *testing.T) {
	t.Parallel()
	const deadline = 20 * time.Second

	t.Run("JobsCancel", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		job := b.createJob(t)
		queue := redistest.Queue(t, redistest.URL())
		r, expired := runTimeout(deadline, "--database-url", b.url, "--redis-url", stallOn(t, job.ID), "--queue", queue,
			"jobs", "cancel", job.ID)
		require.False(t, expired, "ctl jobs cancel ran past %s: %+v", deadline, r)
		requireOneLineError(t, r, 1, "redis did not answer")
		got, err := b.store.Get(t.Context(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
	})
	t.Run("DeadRetryAll", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		var ids []string
		for range 3 {
			ids = append(ids, b.deadJob(t, "default", jobs.ReasonRetriesExhausted, 1).ID)
		}
		queue := redistest.Queue(t, redistest.URL())
		r, expired := runTimeout(deadline, "--database-url", b.url, "--redis-url", stallOn(t, ids...), "--queue", queue,
			"dead", "retry", "--all")
		require.False(t, expired, "ctl dead retry ran past %s: %+v", deadline, r)
		require.Equal(t, 1, r.code, "stdout %q stderr %q", r.out, r.errOut)
		require.Contains(t, r.errOut, "redis did not answer")
		require.Contains(t, r.errOut, "2 more jobs are queued without a task (the sweeper will enqueue them)")
		for _, id := range ids {
			got, err := b.store.Get(t.Context(), id)
			require.NoError(t, err)
			require.Equal(t, jobs.StatusQueued, got.Status, "queued in Postgres: the sweeper enqueues it")
		}
	})
	t.Run("TenantsDelete", func(t *testing.T) {
		// A deletion whose jobs' tasks could not be aborted stops before it deletes: the
		// operator is told that nothing was deleted and what to run; run again, it deletes.
		t.Parallel()
		b := setupJobs(t)
		tenants := tenant.NewStore(b.pool, nil)
		_, _, err := tenants.Create(t.Context(), "acme", nil)
		require.NoError(t, err)
		_, err = tenants.Revoke(t.Context(), "acme")
		require.NoError(t, err)
		job, _, err := b.store.Create(t.Context(), jobs.CreateParams{Tenant: "acme", Credential: "default",
			Request: []byte(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Minute})
		require.NoError(t, err)
		queue := redistest.Queue(t, redistest.URL())
		noSettle := func(a *app) { a.revokeSettle = 0 }
		r, expired := runApp(deadline, noSettle, "--database-url", b.url, "--redis-url", stallOn(t, job.ID), "--queue", queue,
			"tenants", "delete", "acme")
		require.False(t, expired, "ctl tenants delete ran past %s: %+v", deadline, r)
		require.Equal(t, "canceled 1 jobs of tenant acme\n", r.out)
		requireOneLineError(t, r, 1, "redis did not answer")
		require.Contains(t, r.errOut, "tenant acme not deleted (its jobs are canceled): run `ctl tenants delete acme` again")

		r, expired = runApp(deadline, noSettle, "--database-url", b.url, "--redis-url", redistest.URL(), "--queue", queue,
			"tenants", "delete", "acme")
		require.False(t, expired)
		require.Equal(t, 0, r.code, "stderr %q", r.errOut)
		require.Equal(t, "tenant acme deleted, with 1 jobs (their attempts, events and idempotency keys) and its tokens\n", r.out)
	})
}
