package dispatch

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// asynqDequeueScript is asynq v0.26's dequeue script (rdb.dequeueCmd), as its processor sends it.
const asynqDequeueScript = `
if redis.call("EXISTS", KEYS[2]) == 0 then
	local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
	if id then
		local key = ARGV[2] .. id
		redis.call("HSET", key, "state", "active")
		redis.call("HDEL", key, "pending_since")
		redis.call("ZADD", KEYS[4], ARGV[1], id)
		return redis.call("HGET", key, "msg")
	end
end
return nil`

// TestServer_TakesABacklogInBatches: a server with most of its 40 slots free finds 30 tasks
// waiting on the main queue and 3 on the low one; it takes the main queue's in batches (tasks
// kept by a batch dequeue), delivers every task exactly once, and leaves no task active or
// pending. On a Redis Cluster too (the scripts' keys share the queue's slot).
func TestServer_TakesABacklogInBatches(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		r := newIdleWakeRig(t, target.URL, 50*time.Millisecond, 40)
		want := map[string]bool{}
		for i := range 33 {
			id, p := fmt.Sprintf("job-%02d", i), jobs.PriorityNormal
			if i >= 30 {
				p = jobs.PriorityLow
			}
			require.NoError(t, r.enq.Enqueue(t.Context(), id, p, time.Time{}))
			want[id] = true
		}
		r.start(t)
		got := map[string]int{}
		for range 33 {
			got[r.next(t)]++
		}
		for id := range want {
			require.Equal(t, 1, got[id], "%s delivered once", id)
		}
		require.Len(t, got, 33, "no other delivery")
		require.Positive(t, r.srv.hook.prefetched.Load(), "tasks kept by a batch dequeue")
		for _, q := range NewQueues(r.queue).All() {
			require.Eventually(t, func() bool {
				p := "asynq:{" + q + "}:"
				active, err1 := r.rdb.LLen(t.Context(), p+"active").Result()
				pending, err2 := r.rdb.LLen(t.Context(), p+"pending").Result()
				return err1 == nil && err2 == nil && active == 0 && pending == 0
			}, 30*time.Second, 5*time.Millisecond, "%s: every task done", q)
		}
		select {
		case id := <-r.delivered:
			t.Fatalf("%s delivered again", id)
		default:
		}
	})
}

// TestWakeHook_BatchDequeue drives the hook with asynq's dequeue as its processor sends it, on
// the real Redis: with the slots free, one call takes the main queue's five tasks and replies
// with the first; the next is answered from what was kept, with no round trip; what is kept is
// given back at the head of the queue in its order; a kept task older than prefetchMaxAge is given
// back instead of served; a paused queue gives nothing; with most slots busy, the dequeue is
// asynq's own, one task.
func TestWakeHook_BatchDequeue(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		ctx := t.Context()
		rdb := redistest.ClientOf(t, target.URL)
		queue := redistest.Queue(t, target.URL)
		opt, err := RedisConnOpt(target.URL)
		require.NoError(t, err)
		client := asynq.NewClient(opt)
		t.Cleanup(func() { require.NoError(t, client.Close()) })
		enq := NewEnqueuer(client, queue, nil)
		for _, id := range []string{"t1", "t2", "t3", "t4", "t5"} {
			require.NoError(t, enq.Enqueue(ctx, id, jobs.PriorityNormal, time.Time{}))
		}
		p := "asynq:{" + queue + "}:"
		msgOf := func(id string) string {
			m, err := rdb.HGet(ctx, p+"t:"+id, "msg").Result()
			require.NoError(t, err)
			return m
		}
		pending := func() []string {
			ids, err := rdb.LRange(ctx, p+"pending", 0, -1).Result()
			require.NoError(t, err)
			return ids
		}
		trips := 0
		h := newWakeHook(rdb, queue, time.Minute, nil, nil)
		h.concurrency = 40
		dequeue := h.ProcessHook(func(ctx context.Context, cmd redis.Cmder) error {
			trips++
			return rdb.Process(ctx, cmd)
		})
		asked := func() (string, error) {
			cmd := redis.NewCmd(ctx, "eval", asynqDequeueScript, 4, p+"pending", p+"paused", p+"active", p+"lease",
				time.Now().Add(30*time.Second).Unix(), p+"t:")
			err := dequeue(ctx, cmd)
			s, _ := cmd.Val().(string)
			return s, err
		}

		got, err := asked()
		require.NoError(t, err)
		require.Equal(t, msgOf("t1"), got, "the queue's first task")
		require.Empty(t, pending(), "the batch took all five")
		require.EqualValues(t, 4, h.prefetched.Load())
		got, err = asked()
		require.NoError(t, err)
		require.Equal(t, msgOf("t2"), got, "the next from what was kept")
		require.Zero(t, trips, "no call went through asynq's own dequeue")

		require.NoError(t, h.giveBackKept(ctx))
		require.Equal(t, []string{"t5", "t4", "t3"}, pending(), "given back at the head, t3 taken next")
		state, err := rdb.HGet(ctx, p+"t:t3", "state").Result()
		require.NoError(t, err)
		require.Equal(t, "pending", state)
		active, err := rdb.LRange(ctx, p+"active", 0, -1).Result()
		require.NoError(t, err)
		require.ElementsMatch(t, []string{"t1", "t2"}, active, "the tasks handed to asynq stay active")

		got, err = asked()
		require.NoError(t, err)
		require.Equal(t, msgOf("t3"), got)
		h.mu.Lock()
		require.Len(t, h.kept, 2)
		for i := range h.kept {
			h.kept[i].at = h.kept[i].at.Add(-prefetchMaxAge - time.Second)
		}
		h.mu.Unlock()
		got, err = asked()
		require.NoError(t, err)
		require.Equal(t, msgOf("t4"), got, "the stale tasks given back and taken again, in order")
		require.NoError(t, h.giveBackKept(ctx))
		require.Equal(t, []string{"t5"}, pending())

		inspector := asynq.NewInspector(opt)
		t.Cleanup(func() { require.NoError(t, inspector.Close()) })
		require.NoError(t, inspector.PauseQueue(queue))
		_, err = asked()
		require.ErrorIs(t, err, redis.Nil, "a paused queue gives nothing")
		require.NoError(t, inspector.UnpauseQueue(queue))

		h.busy.Store(39)
		got, err = asked()
		require.NoError(t, err)
		require.Equal(t, msgOf("t5"), got)
		require.Equal(t, 1, trips, "with one slot free, asynq's own dequeue")
	})
}

// TestWakeHook_StaleGiveBackRefusedIsLogged: when Redis refuses to take back a task kept too long
// (here the client is closed), the next fresh kept task is still served and the refusal is
// logged, as the task is left to asynq's recoverer.
func TestWakeHook_StaleGiveBackRefusedIsLogged(t *testing.T) {
	t.Parallel()
	opt, err := RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	closed := NewRedisClient(opt)
	require.NoError(t, closed.Close())
	var logged bytes.Buffer
	h := newWakeHook(closed, "llmq-test-"+redistest.Rand(), time.Minute, nil, slog.New(slog.NewTextHandler(&logged, nil)))
	h.kept = []keptTask{{id: "old", msg: "m-old", at: time.Now().Add(-prefetchMaxAge - time.Second)},
		{id: "new", msg: "m-new", at: time.Now()}}
	msg, ok := h.takeKept(t.Context())
	require.True(t, ok)
	require.Equal(t, "m-new", msg, "the stale task skipped")
	require.Empty(t, h.kept)
	require.Contains(t, logged.String(), "left to asynq's recoverer")
	require.Contains(t, logged.String(), "give back 1 prefetched tasks")
}

// TestWakeHook_KeptTasksGoBackWithoutADequeue: tasks a batch kept are given back at their age even
// when asynq asks for nothing more (every slot busy on long calls): left active on no worker's
// list, they waited behind those calls and the sweeper took them for orphans (a second task).
func TestWakeHook_KeptTasksGoBackWithoutADequeue(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := redistest.URL()
	rdb := redistest.ClientOf(t, url)
	queue := redistest.Queue(t, url)
	opt, err := RedisConnOpt(url)
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	t.Cleanup(func() { require.NoError(t, client.Close()) })
	enq := NewEnqueuer(client, queue, nil)
	for _, id := range []string{"t1", "t2", "t3"} {
		require.NoError(t, enq.Enqueue(ctx, id, jobs.PriorityNormal, time.Time{}))
	}
	p := "asynq:{" + queue + "}:"
	h := newWakeHook(rdb, queue, time.Minute, nil, nil)
	h.concurrency, h.maxAge = 40, 50*time.Millisecond
	dequeue := h.ProcessHook(func(ctx context.Context, cmd redis.Cmder) error { return rdb.Process(ctx, cmd) })
	cmd := redis.NewCmd(ctx, "eval", asynqDequeueScript, 4, p+"pending", p+"paused", p+"active", p+"lease",
		time.Now().Add(30*time.Second).Unix(), p+"t:")
	require.NoError(t, dequeue(ctx, cmd))
	require.EqualValues(t, 2, h.prefetched.Load(), "one served, two kept")

	// No dequeue comes: the two are back at the head of the queue, pending, all the same.
	require.Eventually(t, func() bool {
		ids, err := rdb.LRange(ctx, p+"pending", 0, -1).Result()
		return err == nil && len(ids) == 2
	}, 30*time.Second, 5*time.Millisecond)
	for _, id := range []string{"t2", "t3"} {
		state, err := rdb.HGet(ctx, p+"t:"+id, "state").Result()
		require.NoError(t, err)
		require.Equal(t, "pending", state, id)
	}
	h.mu.Lock()
	require.Empty(t, h.kept)
	h.mu.Unlock()
}
