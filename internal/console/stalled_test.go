package console_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/redistest"
)

// setupStalled is setup whose Tasks talk to a stalled Redis (redistest.Stalled) with no read
// timeout: a Redis call waits until the stall ends (the test's end), so an answer that came
// did not wait for Redis. (With the production client's timeouts, each call gives up after
// the retries of its 3 s read timeout: a cancel's abort took 20 s, a retry's requeue as much
// for each job selected.)
func setupStalled(t *testing.T) *testBundle {
	t.Helper()
	addr, unstall := redistest.Stalled(t)
	opt := asynq.RedisClientOpt{Addr: addr, ReadTimeout: -1}
	insp := asynq.NewInspector(opt)
	aclient := asynq.NewClient(opt)
	t.Cleanup(func() { _ = insp.Close(); _ = aclient.Close() })
	b := setupTasks(t, dispatch.NewTasks(insp, dispatch.NewEnqueuer(aclient, redistest.Rand(), nil)))
	t.Cleanup(unstall) // first: what was left in the background fails
	return b
}

// doWithin is c.do with a 15 s deadline on the answer: far above dispatch.RedisWait and a
// loaded machine's Postgres, while the stall lasts the test's length.
func doWithin(t *testing.T, c *client, method, path string, body any) (*http.Response, string) {
	t.Helper()
	c.http.Timeout = 15 * time.Second
	defer func() { c.http.Timeout = 0 }()
	return c.do(method, path, body, nil)
}

// TestJobCancel_StalledRedisDoesNotHoldTheAnswer: with Redis stalled, an operator's cancel
// (committed in Postgres) is answered within dispatch.RedisWait, as the API's DELETE is, not
// after the abort of its task gave up on Redis (20 s; a second click got 409 job_terminal).
func TestJobCancel_StalledRedisDoesNotHoldTheAnswer(t *testing.T) {
	t.Parallel()
	b := setupStalled(t)
	c := b.login(t)
	queued := b.jobs.Create(t, jobstest.Opts{})
	res, out := doWithin(t, c, http.MethodPost, "/console/api/jobs/"+queued.ID+"/cancel", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, out)
	j, err := b.jobs.Store.Get(context.Background(), queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, j.Status)
	require.Equal(t, "job.cancel", b.audit(t)[0].Action)
}

// TestDeadRetry_StalledRedisDoesNotHoldTheAnswer: with Redis stalled, an operator's retry of
// dead letters (committed: queued again in Postgres) is answered within dispatch.RedisWait,
// not after the requeue of every job selected gave up on Redis one after the other (20 s
// each, for up to 1000 jobs: past any timeout, the page never heard what it did). The sweeper
// enqueues them, as after any failed requeue.
func TestDeadRetry_StalledRedisDoesNotHoldTheAnswer(t *testing.T) {
	t.Parallel()
	b := setupStalled(t)
	c := b.login(t)
	d1 := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	d2 := b.jobs.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
	res, out := doWithin(t, c, http.MethodPost, "/console/api/dead/retry", map[string]any{"ids": []string{d1.ID, d2.ID}})
	require.Equal(t, http.StatusOK, res.StatusCode, out)
	require.Contains(t, out, d1.ID)
	for _, id := range []string{d1.ID, d2.ID} {
		j, err := b.jobs.Store.Get(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusQueued, j.Status)
	}
	require.Equal(t, "dead.retry", b.audit(t)[0].Action)
}
