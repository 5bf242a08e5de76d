package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
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

// inFlight is a hook on a Redis client (the fault-injecting wrapper's counting half) that
// counts the commands sent and not answered, and the most there were at once: with a plain
// client each is a goroutine waiting for Redis. A new connection's handshake (HELLO, CLIENT
// SETINFO: through the hooks too, inside the command that dialed) is not counted.
type inFlight struct{ now, most atomic.Int64 }

func (h *inFlight) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *inFlight) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		switch cmd.Name() {
		case "hello", "auth", "select", "client":
			return next(ctx, cmd)
		}
		n := h.now.Add(1)
		for m := h.most.Load(); n > m && !h.most.CompareAndSwap(m, n); m = h.most.Load() {
		}
		defer h.now.Add(-1)
		return next(ctx, cmd)
	}
}

func (h *inFlight) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestSubmit_StalledRedisKeepsAtMostMaxPendingEnqueues: with Redis stalled, each submit's
// enqueue was left in the background for as long as the Redis client tried (40 s each in
// production), without a bound: at 100 submits/s, 4,000 goroutines and commands, all sent at
// once when Redis answered again. Past MaxPending, a submit's enqueue is not sent at all: the
// job, committed and answered 202, is left to the sweeper at once and counted.
func TestSubmit_StalledRedisKeepsAtMostMaxPendingEnqueues(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	opt, unstall := stalledOpt(t)
	rdb := dispatch.NewRedisClient(opt)
	counted := &inFlight{}
	rdb.AddHook(counted)
	t.Cleanup(func() { _ = rdb.Close() })
	t.Cleanup(unstall) // first: the enqueues left in the background fail
	ac := dispatch.NewAfterCommit(&dispatch.AfterCommitConfig{MaxPending: 2,
		After: func(time.Duration) <-chan time.Time { return closedTime }}) // RedisWait has passed
	srv := New(Config{Store: b.store, Pool: b.pool, AllowAnonymous: true,
		Submit:      SubmitConfig{Credentials: []string{"default"}},
		Enqueuer:    dispatch.NewEnqueuer(asynq.NewClientFromRedisClient(rdb), b.queue, nil),
		AfterCommit: ac})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 5 {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/jobs", strings.NewReader(minimalSubmit))
		rec := serveWithin(t, srv, req)
		require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
		var got struct{ ID string }
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &got))
		job, err := b.store.Get(ctx, got.ID)
		require.NoError(t, err, "the job is committed")
		require.Equal(t, jobs.StatusQueued, job.Status)
	}
	require.Eventually(t, func() bool { return counted.now.Load() == 2 }, 15*time.Second, time.Millisecond,
		"the enqueues of the first two submits wait for the stalled Redis: %d, most %d, refused %d", counted.now.Load(), counted.most.Load(), ac.Refused())
	require.EqualValues(t, 2, counted.most.Load(), "no more than MaxPending commands wait for Redis")
	require.EqualValues(t, 3, ac.Refused(), "the other three jobs are the sweeper's")
}

// closedTime is a channel that always receives: a wait that has passed.
var closedTime = func() <-chan time.Time {
	c := make(chan time.Time)
	close(c)
	return c
}()
