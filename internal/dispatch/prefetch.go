package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
)

// A worker with a backlog takes several of the main queue's pending tasks in one round trip.
// asynq's processor asks Redis for one task per free delivery slot, one script call each, so at
// full throttle every job cost the worker and Redis a round trip of its own before anything else
// happened. Under the wakeHook, a dequeue of the main queue while most of the server's slots are
// free takes up to maxPrefetch tasks at once (dequeueBatchScript: asynq's dequeue repeated,
// every task made active with its lease), replies with the first, and keeps the rest; asynq's
// next dequeues of the main queue, which its processor makes at once while it has a free slot,
// are answered from what was kept, without a round trip.
//
// What is kept stays safe:
//   - At most half of the free slots are taken (free: Concurrency less the deliveries running in
//     the handler), so the processor's next calls, the only takers of its slots, always have a
//     slot for every kept task: with the 9:1 weights, the low queue takes about one call in ten.
//   - A kept task older than prefetchMaxAge is given back to the head of its queue instead of
//     served, long before its lease (asynq's 30s, extended only for tasks asynq is running) could
//     run out and asynq's recoverer retry it under a running delivery; a timer per batch gives
//     it back then even when no dequeue comes (every slot busy on long calls), before the
//     sweeper's grace would take it for an orphan.
//   - Shutdown gives back what is kept (Server.Shutdown); a crashed worker's kept tasks are
//     active with a lease, as its running ones are, and asynq's recoverer retries them.
//   - Only the main queue is taken in batches: a low task kept while main tasks fill the slots
//     could wait for a free slot past its lease.

// maxPrefetch is the most main-queue tasks one dequeue takes.
const maxPrefetch = 16

// prefetchMaxAge is how long a kept task may wait to be served before it is given back.
const prefetchMaxAge = 5 * time.Second

// dequeueBatchScript is asynq's dequeue script (rdb.dequeueCmd, asynq v0.26) taking up to
// ARGV[3] tasks, each with the lease end ARGV[1], and replying {id, msg, id, msg, ...} or nil.
// Its first two keys are in another order than asynq's dequeue's (paused, then pending), so that
// the wakeHook, through whose client it runs, does not take it for asynq's.
//
// KEYS: paused, pending, active, lease of the queue; ARGV: lease end (Unix seconds), the task
// key prefix, the most tasks to take.
var dequeueBatchScript = redisscript.NewScript(`
if redis.call("EXISTS", KEYS[1]) == 1 then
	return nil
end
local out = {}
for i = 1, tonumber(ARGV[3]) do
	local id = redis.call("RPOPLPUSH", KEYS[2], KEYS[3])
	if not id then
		break
	end
	local key = ARGV[2] .. id
	redis.call("HSET", key, "state", "active")
	redis.call("HDEL", key, "pending_since")
	redis.call("ZADD", KEYS[4], ARGV[1], id)
	out[#out + 1] = id
	out[#out + 1] = redis.call("HGET", key, "msg")
end
if #out == 0 then
	return nil
end
return out`)

// giveBackScript puts active tasks back at the head of their pending list (asynq's requeue
// script for several tasks, the first given taken first). A task no longer active is left alone.
//
// KEYS: active, lease, pending of the queue; ARGV: the task key prefix, then the task IDs.
var giveBackScript = redisscript.NewScript(`
for i = #ARGV, 2, -1 do
	local id = ARGV[i]
	if redis.call("LREM", KEYS[1], 0, id) > 0 then
		redis.call("ZREM", KEYS[2], id)
		redis.call("RPUSH", KEYS[3], id)
		redis.call("HSET", ARGV[1] .. id, "state", "pending")
	end
end
return 0`)

// keptTask is a task taken by a batch dequeue and not yet handed to asynq.
type keptTask struct {
	id, msg string
	at      time.Time
}

// prefetchSize is how many tasks the next dequeue of the main queue may take: half of the free
// slots, at most maxPrefetch; below 2 the dequeue is asynq's own.
func (h *wakeHook) prefetchSize() int {
	if h.concurrency == 0 {
		return 1
	}
	free := h.concurrency - int(h.busy.Load())
	return min(maxPrefetch, free/2)
}

// dequeue answers an asynq dequeue of queue q (cmd, its keys and arguments as asynq sent them):
// from the kept tasks, with a batch, or as sent. Its error is cmd's: redis.Nil when q has no task.
func (h *wakeHook) dequeue(ctx context.Context, next redis.ProcessHook, cmd *redis.Cmd, q string) error {
	if q != h.base {
		return next(ctx, cmd)
	}
	if msg, ok := h.takeKept(ctx); ok {
		cmd.SetVal(msg)
		return nil
	}
	n := h.prefetchSize()
	// EVALSHA|EVAL, the script, 4, its keys (pending, paused, active, lease), the lease end and
	// the task key prefix: the lease end is the one argument taken from asynq's call.
	args := cmd.Args()
	if n < 2 || len(args) != 9 {
		return next(ctx, cmd)
	}
	mainQ := h.queues[0]
	res, err := dequeueBatchScript.Run(ctx, h.rdb, mainQ.dequeueKeys, args[7], mainQ.tasksArg, n).
		StringSlice()
	if err != nil || len(res) < 2 || len(res)%2 != 0 {
		if err == nil {
			err = fmt.Errorf("batch dequeue: unexpected reply of %d values", len(res))
		}
		cmd.SetErr(err)
		return err
	}
	now := time.Now()
	h.mu.Lock()
	for i := 2; i < len(res); i += 2 {
		h.kept = append(h.kept, keptTask{id: res[i], msg: res[i+1], at: now})
	}
	h.mu.Unlock()
	if len(res) > 2 {
		// Given back at their age whether or not asynq asks again: with every slot busy on long
		// calls no dequeue comes, and a task active on no worker's list is the sweeper's orphan.
		time.AfterFunc(h.maxAge, func() { h.giveBackStale(context.WithoutCancel(ctx)) })
	}
	h.prefetched.Add(int64(len(res)/2 - 1))
	cmd.SetVal(res[1])
	return nil
}

// takeKept returns the oldest kept task's message, giving back those kept too long.
func (h *wakeHook) takeKept(ctx context.Context) (string, bool) {
	h.mu.Lock()
	stale := h.takeStale()
	var msg string
	ok := len(h.kept) > 0
	if ok {
		msg = h.kept[0].msg
		h.kept = h.kept[1:]
	}
	h.mu.Unlock()
	h.giveBackStaleIDs(ctx, stale)
	return msg, ok
}

// takeStale removes the kept tasks kept maxAge or longer and returns their ids. h.mu is held.
func (h *wakeHook) takeStale() []string {
	var stale []string
	for len(h.kept) > 0 && time.Since(h.kept[0].at) >= h.maxAge {
		stale = append(stale, h.kept[0].id)
		h.kept = h.kept[1:]
	}
	return stale
}

// giveBackStale gives back the kept tasks kept maxAge or longer (a batch's timer).
func (h *wakeHook) giveBackStale(ctx context.Context) {
	h.mu.Lock()
	stale := h.takeStale()
	h.mu.Unlock()
	h.giveBackStaleIDs(ctx, stale)
}

// giveBackStaleIDs gives back the kept tasks stale (takeStale's), logging a refusal: they are
// left to asynq's recoverer then.
func (h *wakeHook) giveBackStaleIDs(ctx context.Context, stale []string) {
	if len(stale) == 0 {
		return
	}
	if err := h.giveBack(ctx, stale); err != nil {
		h.log.Warn("tasks kept too long are left to asynq's recoverer", "err", err)
	}
}

// giveBackKept puts every kept task back at the head of the main queue.
func (h *wakeHook) giveBackKept(ctx context.Context) error {
	h.mu.Lock()
	ids := make([]string, 0, len(h.kept))
	for _, k := range h.kept {
		ids = append(ids, k.id)
	}
	h.kept = nil
	h.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	return h.giveBack(ctx, ids)
}

// giveBack puts the main queue's active tasks ids back at its head, ids[0] first.
func (h *wakeHook) giveBack(ctx context.Context, ids []string) error {
	mainQ := h.queues[0]
	args := make([]any, 0, len(ids)+1)
	args = append(args, mainQ.tasksArg)
	var a redisscript.Args // the ids copied into one buffer: boxing each took an allocation
	for _, id := range ids {
		args = append(args, a.Text(id))
	}
	err := giveBackScript.Run(context.WithoutCancel(ctx), h.rdb, mainQ.giveBackKeys, args...).Err()
	if err != nil {
		return fmt.Errorf("give back %d prefetched tasks: %w", len(ids), err)
	}
	return nil
}
