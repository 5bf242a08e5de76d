package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// wakeRig is a Server on a fresh llmq queue whose holds last exactly its poll interval (no
// random spread), an Enqueuer with a wake-up client, and the deliveries' job IDs.
type wakeRig struct {
	queue     string
	metrics   *Metrics
	srv       *Server
	client    *asynq.Client
	rdb       redis.UniversalClient
	enq       *Enqueuer
	delivered chan string
}

func newWakeRig(t *testing.T, url string, poll time.Duration) *wakeRig {
	t.Helper()
	r := newIdleWakeRig(t, url, poll, 2)
	r.start(t)
	return r
}

// heldPoll is the poll interval of newHeldRig's server: far beyond any test's deadline, so that
// a delivery within it can only have been woken for.
const heldPoll = time.Hour

// newHeldRig is newWakeRig whose holds last heldPoll (not capped at maxHold, on a Redis client
// without a read timeout): a task delivered before the test's deadline ended a hold by a
// wake-up, whatever the machine's speed.
func newHeldRig(t *testing.T, url string) *wakeRig {
	t.Helper()
	r := newIdleWakeRig(t, url, heldPoll, 2)
	r.srv.hook.maxHold = heldPoll
	r.start(t)
	return r
}

// newIdleWakeRig is newWakeRig with concurrency delivery slots, not started yet.
func newIdleWakeRig(t *testing.T, url string, poll time.Duration, concurrency int) *wakeRig {
	t.Helper()
	opt, err := RedisConnOpt(url)
	require.NoError(t, err)
	if poll > maxHold {
		opt = withoutReadTimeout(opt) // a hold (newHeldRig) lasts longer than a read may
	}
	r := &wakeRig{queue: redistest.Queue(t, url), client: asynq.NewClient(opt), rdb: redistest.ClientOf(t, url),
		delivered: make(chan string, 64)}
	t.Cleanup(func() { require.NoError(t, r.client.Close()) })
	r.enq = NewEnqueuer(r.client, r.queue, r.rdb)
	r.metrics = NewMetrics(prometheus.NewRegistry())
	r.srv = NewServer(opt, ServerConfig{Queue: r.queue, Concurrency: concurrency, PollInterval: poll,
		Policy: retrypolicy.New(&retrypolicy.Config{}), Metrics: r.metrics})
	r.srv.hook.float64 = func() float64 { return 0.5 }
	return r
}

// withoutReadTimeout returns opt whose client waits for a reply as long as it takes.
func withoutReadTimeout(opt asynq.RedisConnOpt) asynq.RedisConnOpt {
	switch o := opt.(type) {
	case asynq.RedisClientOpt:
		o.ReadTimeout = -1
		return o
	case asynq.RedisClusterClientOpt:
		o.ReadTimeout = -1
		return o
	}
	return opt
}

// start starts the rig's server, shut down when the test ends.
func (r *wakeRig) start(t *testing.T) {
	t.Helper()
	require.NoError(t, r.srv.Start(Mux(r, r.enq)))
	t.Cleanup(func() { r.shutdown(t) })
}

// shutdown shuts the server down, waking it meanwhile: asynq's shutdown waits for the hold under
// way to end, and a hold that nobody wakes lasts its poll interval (an hour for newHeldRig).
func (r *wakeRig) shutdown(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.srv.Shutdown()
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
			wake(context.Background(), r.rdb, r.queue, r.queue)
		case <-deadline.C:
			t.Error("the server's shutdown did not end within a minute")
			return
		}
	}
}

// waitsEndedBy reads llmq_worker_idle_waits_total{ended}.
func (r *wakeRig) waitsEndedBy(ended string) float64 {
	return testutil.ToFloat64(r.metrics.idleWaits.WithLabelValues(ended))
}

// Process implements Processor: it reports the delivery's job.
func (r *wakeRig) Process(ctx context.Context, d Delivery) error {
	select {
	case r.delivered <- d.JobID:
	case <-ctx.Done():
	}
	return nil
}

// holdBegun waits until the idle server has begun a hold after the n it had, and returns about
// when (checked every millisecond).
func (r *wakeRig) holdBegun(t *testing.T, n int64) time.Time {
	t.Helper()
	require.Eventually(t, func() bool { return r.srv.hook.holds.Load() > n }, 30*time.Second, time.Millisecond,
		"an idle server holds its empty dequeue (asynq's dequeue recognized)")
	return time.Now()
}

// next returns the next delivery's job ID, failing after 30s.
func (r *wakeRig) next(t *testing.T) string {
	t.Helper()
	select {
	case id := <-r.delivered:
		return id
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30s")
		return ""
	}
}

// TestServer_AWakeUpEndsTheHold: an idle server holds its empty dequeue for its poll interval
// (an hour here); a task enqueued due now, on the main or the low queue, is delivered before the
// test's deadline, and a token ended the hold. On a Redis Cluster too (the wake set and the
// queue's keys share a slot).
func TestServer_AWakeUpEndsTheHold(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		r := newHeldRig(t, target.URL)
		var held int64 // the holds begun before the one the next task is enqueued in
		for i, p := range []jobs.Priority{jobs.PriorityNormal, jobs.PriorityLow} {
			wakes := r.waitsEndedBy(waitEndedByWakeUp)
			r.holdBegun(t, held)
			held = r.srv.hook.holds.Load() // the hold under way: the next begins after a wake-up
			id := "job-" + string(p) + redistest.Rand()
			require.NoError(t, r.enq.Enqueue(t.Context(), id, p, time.Time{}))
			require.Equal(t, id, r.next(t), "delivery %d: long before the hold's time", i)
			require.Equal(t, wakes+1, r.waitsEndedBy(waitEndedByWakeUp), "%s: a wake-up ended the hold", p)
			require.Zero(t, r.waitsEndedBy(waitEndedByPoll), "%s: no hold lasted its time", p)
		}
	})
}

// TestServer_AForwardedTaskWakesTheServer: a task enqueued for later (no wake-up at the enqueue)
// is moved to pending by asynq's forwarder when its time comes, and the server is woken for it
// instead of finding it at the end of its hold (an hour).
func TestServer_AForwardedTaskWakesTheServer(t *testing.T) {
	t.Parallel()
	r := newHeldRig(t, redistest.URL())
	r.holdBegun(t, 0)
	require.NoError(t, r.enq.Enqueue(t.Context(), "later", jobs.PriorityNormal, time.Now().Add(10*time.Millisecond)))
	members, err := r.rdb.ZRange(t.Context(), wakeKey(r.queue), 0, -1).Result()
	require.NoError(t, err)
	require.Empty(t, members, "a task for later wakes nobody at its enqueue")
	require.Equal(t, "later", r.next(t), "delivered long before the hold's time")
	require.Equal(t, 1.0, r.waitsEndedBy(waitEndedByWakeUp), "the forwarder's move woke the server")
	require.Zero(t, r.waitsEndedBy(waitEndedByPoll), "no hold lasted its time")
}

// TestServer_PollsForWhatNobodyWokeItFor: a task enqueued without a wake-up (an Enqueuer without
// a wake-up client) is delivered after a hold's time; holds last their time (the three begun
// after a moment and ended take about three poll intervals: an idle server does not spin).
func TestServer_PollsForWhatNobodyWokeItFor(t *testing.T) {
	t.Parallel()
	const poll = 50 * time.Millisecond
	r := newWakeRig(t, redistest.URL(), poll)
	begun := r.holdBegun(t, 0)
	// Counted from the holds begun when the first was seen (more than one on a loaded machine,
	// whose check comes late): the three after those begin after begun and end before the next.
	// Redis counts a blocking timeout from its own cached clock, a few ms early at times.
	r.holdBegun(t, r.srv.hook.holds.Load()+3)
	require.GreaterOrEqual(t, time.Since(begun), 5*poll/2, "each hold lasts its time")
	require.NoError(t, NewEnqueuer(r.client, r.queue, nil).Enqueue(t.Context(), "unannounced", jobs.PriorityNormal, time.Time{}))
	require.Equal(t, "unannounced", r.next(t))
	require.Zero(t, r.waitsEndedBy(waitEndedByWakeUp), "found by a poll")
	require.GreaterOrEqual(t, r.waitsEndedBy(waitEndedByPoll), 3.0, "the waits the poll ended")
}

// TestEnqueuer_WakeSet: a task due now leaves its asynq queue's name in the llmq queue's wake set,
// once however many tasks; a task for later, a task that exists already, or an Enqueuer without
// a wake-up client, none; a wake-up is sent even when the caller's context has ended.
func TestEnqueuer_WakeSet(t *testing.T) {
	t.Parallel()
	url := redistest.URL()
	opt, err := RedisConnOpt(url)
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	t.Cleanup(func() { require.NoError(t, client.Close()) })
	rdb := redistest.ClientOf(t, url)
	queue := redistest.Queue(t, url)
	ctx := t.Context()
	members := func() []string {
		m, err := rdb.ZRange(ctx, wakeKey(queue), 0, -1).Result()
		require.NoError(t, err)
		return m
	}

	require.NoError(t, NewEnqueuer(client, queue, nil).Enqueue(ctx, "silent", jobs.PriorityNormal, time.Time{}))
	require.Empty(t, members(), "no wake-up client")
	enq := NewEnqueuer(client, queue, rdb)
	require.NoError(t, enq.Enqueue(ctx, "later", jobs.PriorityNormal, time.Now().Add(time.Hour)))
	require.Empty(t, members(), "a task for later")
	for _, id := range []string{"a", "b", "c"} {
		require.NoError(t, enq.Enqueue(ctx, id, jobs.PriorityNormal, time.Time{}))
	}
	require.NoError(t, enq.Enqueue(ctx, "d", jobs.PriorityLow, time.Time{}))
	require.ElementsMatch(t, []string{queue, queue + ":low"}, members(), "each queue named once")

	require.NoError(t, rdb.Del(ctx, wakeKey(queue)).Err())
	require.NoError(t, enq.Enqueue(ctx, "a", jobs.PriorityNormal, time.Time{}))
	require.Empty(t, members(), "a task enqueued again (it exists) wakes nobody")
	gone, cancel := context.WithCancel(ctx)
	cancel()
	wake(gone, rdb, queue, queue)
	require.Equal(t, []string{queue}, members(), "sent though the submit's context ended after the enqueue")
}

// scriptReply is a fake of Redis's replies to asynq's script calls, for the hook's state
// machine: each call takes the next reply (a value, or nil for an empty reply).
type scriptReply struct {
	replies []any
	calls   int
}

func (s *scriptReply) process(_ context.Context, cmd redis.Cmder) error {
	c := cmd.(*redis.Cmd)
	v := s.replies[s.calls]
	s.calls++
	if v == nil {
		c.SetErr(redis.Nil)
	} else {
		c.SetVal(v)
	}
	return c.Err()
}

// TestWakeHook_StateMachine drives the hook with asynq's script calls as they come (their
// replies faked, the wake set in the real Redis): an empty dequeue holds only once every queue
// is known empty; woken for another queue, the hold replies empty at once; woken for its own
// queue, it asks again and replies with the task; a forward that moved tasks names its queue in
// the wake set, one that moved none does not.
func TestWakeHook_StateMachine(t *testing.T) {
	t.Parallel()
	rdb := redistest.ClientOf(t, redistest.URL())
	queue := redistest.Queue(t, redistest.URL())
	low := NewQueues(queue).For(jobs.PriorityLow)
	ctx := t.Context()
	m := NewMetrics(prometheus.NewRegistry())
	h := newWakeHook(rdb, queue, time.Minute, m, nil) // a hold without a wake-up would fail the test's deadline
	script := func(q string, kind asynqScript) *redis.Cmd {
		p := "asynq:{" + q + "}:"
		if kind == forwardScript {
			return redis.NewCmd(ctx, "evalsha", "sha", 2, p+"retry", p+"pending", 1, p+"t:", 2, p+"g:")
		}
		return redis.NewCmd(ctx, "evalsha", "sha", 4, p+"pending", p+"paused", p+"active", p+"lease", 1, p+"t:")
	}
	wakeFor := func(q string) { wake(ctx, rdb, queue, q) }

	fake := &scriptReply{replies: []any{nil, nil, nil, "task"}}
	process := h.ProcessHook(fake.process)
	require.ErrorIs(t, process(ctx, script(queue, dequeueScript)), redis.Nil, "main empty: low not known yet, no hold")
	require.Zero(t, h.holds.Load())
	wakeFor(queue)
	require.ErrorIs(t, process(ctx, script(low, dequeueScript)), redis.Nil, "low empty: every queue known, a hold woken for main")
	require.Equal(t, 1.0, testutil.ToFloat64(m.idleWaits.WithLabelValues(waitEndedByWakeUp)))
	require.Equal(t, 2, fake.calls, "woken for another queue: not asked again")

	wakeFor(queue)
	cmd := script(queue, dequeueScript)
	require.NoError(t, process(ctx, cmd), "main empty while low is known empty: a hold woken for main")
	require.Equal(t, "task", cmd.Val(), "asked again, it replies with the task")
	require.Equal(t, 4, fake.calls)
	require.EqualValues(t, 2, h.holds.Load())

	fwd := &scriptReply{replies: []any{int64(0), int64(3)}}
	forward := h.ProcessHook(fwd.process)
	members := func() []string {
		m, err := rdb.ZRange(ctx, wakeKey(queue), 0, -1).Result()
		require.NoError(t, err)
		return m
	}
	require.NoError(t, forward(ctx, script(low, forwardScript)))
	require.Empty(t, members(), "a forward that moved nothing wakes nobody")
	require.NoError(t, forward(ctx, script(low, forwardScript)))
	require.Equal(t, []string{low}, members(), "a forward that moved tasks names their queue")
	require.Equal(t, 4, fake.calls)
}

// TestWakeHook_HoldKeepsThePaceWhenRedisRefusesTheWait: when the wait itself fails (here the
// client is closed), a hold still lasts its time instead of letting asynq ask again at once, and
// counts as ended by the poll.
func TestWakeHook_HoldKeepsThePaceWhenRedisRefusesTheWait(t *testing.T) {
	t.Parallel()
	opt, err := RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	closed := NewRedisClient(opt)
	require.NoError(t, closed.Close())
	m := NewMetrics(prometheus.NewRegistry())
	const poll = 100 * time.Millisecond
	h := newWakeHook(closed, "llmq-test-"+redistest.Rand(), poll, m, nil)
	h.float64 = func() float64 { return 0.5 } // the hold lasts exactly poll
	start := time.Now()
	require.Empty(t, h.hold(t.Context()), "no queue named")
	require.GreaterOrEqual(t, time.Since(start), poll, "the hold lasted its time")
	require.Equal(t, 1.0, testutil.ToFloat64(m.idleWaits.WithLabelValues(waitEndedByPoll)))
}
