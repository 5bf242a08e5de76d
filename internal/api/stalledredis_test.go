package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// stalledOpt is a Redis connection to a stalled Redis (redistest.Stalled) whose reads never time
// out: a call waits until the stall ends, so an answer that came while it lasts did not wait for
// Redis (with the production client's timeouts it waits 20 to 40 s, the retries of its 3 s read
// timeout). The function returned ends the stall.
func stalledOpt(t *testing.T) (asynq.RedisClientOpt, func()) {
	addr, end := redistest.Stalled(t)
	return asynq.RedisClientOpt{Addr: addr, ReadTimeout: -1}, end
}

// serveWithin serves req and fails the test when no answer came within 15 s: far above
// dispatch.RedisWait and a loaded machine's Postgres, while the stall lasts the test's length.
func serveWithin(t *testing.T, h http.Handler, req *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.ServeHTTP(rec, req)
	}()
	select {
	case <-done:
		return rec
	case <-time.After(15 * time.Second):
		t.Fatal("the answer waited for the stalled Redis")
		return nil
	}
}

// TestSubmit_StalledRedisDoesNotHoldTheAnswer: with Redis stalled, a submit whose job is
// committed is answered 202 within dispatch.RedisWait, not after the Redis client's retries of
// its read timeout (4 × 3 s, 40 s in all): past the server's write timeout, the client, cut off
// without learning of its job, would submit (and, without an Idempotency-Key, pay for) it again.
// The job waits for the sweeper, as after any failed enqueue.
func TestSubmit_StalledRedisDoesNotHoldTheAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	// The enqueuer as FromConfig builds it: the autopipeliner waits for its batch's reply.
	opt, unstall := stalledOpt(t)
	rdb := dispatch.NewRedisClient(opt)
	t.Cleanup(func() { _ = rdb.Close() })
	t.Cleanup(unstall) // first: the enqueue left in the background fails
	aclient := asynq.NewClientFromRedisClient(dispatch.AutoPipelined(rdb, enqueueBatches))
	srv := New(Config{Store: b.store, Pool: b.pool, AllowAnonymous: true,
		Submit:   SubmitConfig{Credentials: []string{"default"}},
		Enqueuer: dispatch.NewEnqueuer(aclient, b.queue, dispatch.Deferred(rdb))})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit))
	rec := serveWithin(t, srv, req)
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	var got struct{ ID string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
	job, err := b.store.Get(ctx, got.ID)
	require.NoError(t, err, "the job is committed")
	require.Equal(t, jobs.StatusQueued, job.Status)
}

// TestCancel_StalledRedisDoesNotHoldTheAnswer: with Redis stalled, a cancel (committed in
// Postgres, after which no result can be stored) is answered within dispatch.RedisWait, not
// after the abort of its task gave up on Redis (20 s: a client that retried got 409).
func TestCancel_StalledRedisDoesNotHoldTheAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	job := b.create(t, "")
	opt, unstall := stalledOpt(t)
	insp := asynq.NewInspector(opt)
	aclient := asynq.NewClient(opt)
	t.Cleanup(func() { _ = insp.Close(); _ = aclient.Close() })
	t.Cleanup(unstall) // first: the abort left in the background fails
	srv := New(Config{Store: b.store, Pool: b.pool, AllowAnonymous: true,
		Submit: SubmitConfig{Credentials: []string{"default"}},
		Tasks:  dispatch.NewTasks(insp, dispatch.NewEnqueuer(aclient, b.queue, nil))})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodDelete, "/v1/jobs/"+job.ID, nil)
	rec := serveWithin(t, srv, req)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	got, err := b.store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
}
