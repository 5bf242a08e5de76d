package dispatch

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// An idle worker is woken when a task becomes pending. asynq's processor asks its queues for a
// task, one dequeue script call per queue, and when every queue came back empty it sleeps
// (Config.TaskCheckInterval) before asking again: a task enqueued into an idle worker waited for
// the end of that sleep, 5-15 ms at a 10 ms poll, most of a job's pick-up; and the shorter the
// sleep, the more an idle worker polls. The sleep cannot be cut short from outside asynq, so the
// waiting moves into the Redis client asynq is given, under a hook (wakeHook):
//
//   - An empty dequeue reply, once every queue is known empty, is held until a wake-up names a
//     queue or the poll interval passes; woken for the queue it holds, the hook asks again and
//     replies with the task. asynq's own sleep is made negligible (wokenSleep).
//   - A wake-up is the asynq queue's name in the llmq queue's wake set (wakeKey): an Enqueuer
//     leaves it after enqueueing a task due now, and the hook after asynq's forwarder moved
//     scheduled or retried tasks to pending (a deferral's or a retry's time came).
//   - A name wakes one waiting worker (BZPOPMIN), and the set holds each name once, so a burst of
//     tasks into busy workers wakes a worker in vain once at most.
//
// The poll interval is left to bound what comes without a wake-up: a lost wake-up, a task
// requeued by asynq's inspector, or one enqueued by a process without a wake-up client.
//
// The same hook takes a main-queue backlog several tasks a round trip (see prefetch.go).

// wokenSleep is asynq's TaskCheckInterval under a wakeHook: the sleep after a round that found
// nothing (asynq sleeps between half and one and a half of it), e.g. after a hold woken for
// another queue than the one held.
const wokenSleep = 200 * time.Microsecond

// maxHold caps one hold below the Redis client's read timeout (asynq's default 3s), which bounds
// a blocking command's reply too: with a longer poll interval an idle worker asks every maxHold.
// (wakeHook.maxHold; tests whose client has no read timeout lift it.)
const maxHold = 2 * time.Second

// wakeKey is the wake set of the llmq queue named base: under the main asynq queue's keys (its
// Redis Cluster slot; removed with them).
func wakeKey(base string) string { return "asynq:{" + base + "}:llmq-wake" }

// wake leaves queue's name (an asynq queue that has a task pending) in the wake set of the llmq
// queue named base. An error is dropped: the task is in its queue already, and a lost wake-up only
// leaves it to a worker's next poll; so the reply is not read either, and on a Deferred client the
// caller does not wait for it (on any other, the call has waited already). The wake-up is sent
// even when ctx was canceled meanwhile (a client gone after its job was enqueued).
func wake(ctx context.Context, rdb redis.Cmdable, base, queue string) {
	rdb.ZAdd(context.WithoutCancel(ctx), wakeKey(base), redis.Z{Member: queue})
}

// wakeHook is the hook on an asynq server's Redis client that holds its idle processor's empty
// replies and wakes workers after the forwarder's moves (see the comment at the top of this
// file). It recognizes asynq's scripts by their keys: the dequeue's first two are
// "asynq:{<queue>}:pending" and "asynq:{<queue>}:paused", the forward's "asynq:{<queue>}:scheduled"
// or "asynq:{<queue>}:retry" and "asynq:{<queue>}:pending", for a queue it serves. Only the
// processor's one dequeue loop makes dequeue calls.
type wakeHook struct {
	rdb     redis.UniversalClient
	base    string
	queues  []queueKeys
	poll    time.Duration
	maxHold time.Duration // caps a hold: the constant maxHold
	float64 func() float64
	metrics *Metrics
	log     *slog.Logger

	mu sync.Mutex
	// empty holds the queues asked and found empty since the last hold's time passed, and not
	// named by a wake-up since.
	empty map[string]bool

	// kept are the main queue's tasks a batch dequeue took and asynq has not asked for yet,
	// oldest first (see prefetch.go); maxAge is how long one is kept before it is given back
	// (prefetchMaxAge).
	kept   []keptTask
	maxAge time.Duration

	// concurrency is the server's delivery slots (0: no batch dequeues), busy the deliveries
	// running in its handler.
	concurrency int
	busy        atomic.Int64

	// holds counts the holds begun, prefetched the tasks kept by batch dequeues.
	holds      atomic.Int64
	prefetched atomic.Int64
}

// queueKeys are the keys of one asynq queue that its dequeue and forward scripts start with,
// and those the batch dequeue and its give-back use (see prefetch.go): the active list, the
// lease set and the task keys' prefix.
type queueKeys struct {
	name, pending, paused, scheduled, retry, active, lease, tasks string
	// dequeueKeys and giveBackKeys are the KEYS of dequeueBatchScript and giveBackScript, and
	// tasksArg is tasks, boxed once as the scripts take them (read only).
	dequeueKeys, giveBackKeys []any
	tasksArg                  any
}

// newWakeHook returns the hook for the asynq queues of the llmq queue named base, whose server
// asks through rdb every poll when idle and not woken; m (nil: none) counts the waits' ends; log
// (nil: discard) hears of kept tasks it could not give back.
func newWakeHook(rdb redis.UniversalClient, base string, poll time.Duration, m *Metrics, log *slog.Logger) *wakeHook {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &wakeHook{rdb: rdb, base: base, poll: poll, maxHold: maxHold, float64: rand.Float64, metrics: m, log: log, empty: map[string]bool{},
		maxAge: prefetchMaxAge}
	for _, q := range NewQueues(base).All() {
		p := "asynq:{" + q + "}:"
		k := queueKeys{name: q, pending: p + "pending", paused: p + "paused",
			scheduled: p + "scheduled", retry: p + "retry", active: p + "active", lease: p + "lease",
			tasks: p + "t:"}
		k.dequeueKeys = []any{k.paused, k.pending, k.active, k.lease}
		k.giveBackKeys = []any{k.active, k.lease, k.pending}
		k.tasksArg = k.tasks
		h.queues = append(h.queues, k)
	}
	return h
}

// DialHook implements redis.Hook.
func (h *wakeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessPipelineHook implements redis.Hook.
func (h *wakeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// ProcessHook implements redis.Hook: an empty dequeue reply while every other queue is known
// empty comes back after a wake-up or the hold's time, with the queue's task when the wake-up
// named it; a forward that moved tasks leaves a wake-up; a dequeue of the main queue may be
// answered from or with a batch (see prefetch.go).
func (h *wakeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		reply, ok := cmd.(*redis.Cmd) // what go-redis's Script.Run sends
		if !ok {
			return next(ctx, cmd)
		}
		script, q := h.scriptOf(reply.Args())
		switch script {
		case forwardScript:
			err := next(ctx, cmd)
			if n, _ := reply.Int64(); n > 0 {
				wake(ctx, h.rdb, h.base, q)
			}
			return err
		case dequeueScript:
			err := h.dequeue(ctx, next, reply, q)
			if !h.found(q, err) || h.hold(ctx) != q {
				return err
			}
			// The same call again: its lease end, computed by asynq before the hold, is
			// shorter by the hold (at most maxHold of asynq's 30s lease, which its heartbeat
			// extends).
			again := redis.NewCmd(ctx, reply.Args()...)
			err = h.dequeue(ctx, next, again, q)
			h.found(q, err)
			reply.SetVal(again.Val())
			reply.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// asynqScript is an asynq script call the hook acts on.
type asynqScript int

const (
	otherCommand asynqScript = iota
	dequeueScript
	forwardScript
)

// scriptOf returns which asynq script args call, and for which served queue:
// EVALSHA|EVAL <script> <key count> <key>... <arg>..., the dequeue's keys being the queue's
// pending, paused, active and lease keys, the forward's its scheduled or retry set and pending
// list.
func (h *wakeHook) scriptOf(args []any) (asynqScript, string) {
	if len(args) < 5 {
		return otherCommand, ""
	}
	if name, _ := args[0].(string); !strings.EqualFold(name, "evalsha") && !strings.EqualFold(name, "eval") {
		return otherCommand, ""
	}
	first, _ := args[3].(string)
	second, _ := args[4].(string)
	for _, q := range h.queues {
		switch {
		case first == q.pending && second == q.paused:
			return dequeueScript, q.name
		case (first == q.scheduled || first == q.retry) && second == q.pending:
			return forwardScript, q.name
		}
	}
	return otherCommand, ""
}

// found records what a dequeue of q found (err: redis.Nil when nothing) and reports whether
// every queue is now known empty.
func (h *wakeHook) found(q string, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !errors.Is(err, redis.Nil) {
		delete(h.empty, q)
		return false
	}
	h.empty[q] = true
	return len(h.empty) == len(h.queues)
}

// hold waits for a wake-up, at most the poll interval spread like asynq's sleep (between half and
// one and a half of it) and never more than maxHold, and returns the queue it names ("" when the
// time passed: then every queue is asked again before the next hold).
func (h *wakeHook) hold(ctx context.Context) string {
	h.holds.Add(1)
	d := min(h.poll/2+time.Duration(h.float64()*float64(h.poll)), h.maxHold)
	start := time.Now()
	popped, err := h.rdb.Do(ctx, "bzpopmin", wakeKey(h.base), strconv.FormatFloat(d.Seconds(), 'f', 6, 64)).Slice()
	h.mu.Lock()
	if err == nil && len(popped) == 3 {
		q, _ := popped[1].(string)
		delete(h.empty, q)
		h.mu.Unlock()
		h.metrics.idleWaitEnded(waitEndedByWakeUp)
		return q
	}
	clear(h.empty)
	h.mu.Unlock()
	h.metrics.idleWaitEnded(waitEndedByPoll)
	if err != nil && !errors.Is(err, redis.Nil) {
		// Redis refused the wait (the dequeue worked, so this is rare): keep the pace anyway.
		sleepCtx(ctx, d-time.Since(start))
	}
	return ""
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
