package dispatch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// TestWakeHook_WireArgs pins the exact arguments of the batch dequeue and of the give-back:
// workers of the last release run the same scripts on the same queues, so however the arguments
// are built they must reach Redis byte for byte as before.
func TestWakeHook_WireArgs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := redistest.URL()
	queue := redistest.Queue(t, url)
	opt, err := RedisConnOpt(url)
	require.NoError(t, err)
	client := asynq.NewClient(opt)
	t.Cleanup(func() { require.NoError(t, client.Close()) })
	p := "asynq:{" + queue + "}:"
	dequeueCmd := func() *redis.Cmd {
		return redis.NewCmd(ctx, "eval", asynqDequeueScript, 4, p+"pending", p+"paused", p+"active", p+"lease",
			int64(1893499230), p+"t:")
	}
	// Both scripts cached first (an empty queue's dequeue, a give-back of no active task): each
	// call then goes as one EVALSHA.
	warm := newWakeHook(redistest.ClientOf(t, url), queue, time.Minute, nil, nil)
	warm.concurrency = 40
	require.ErrorIs(t, warm.dequeue(ctx, nil, dequeueCmd(), queue), redis.Nil)
	require.NoError(t, warm.giveBack(ctx, []string{"t0"}))
	enq := NewEnqueuer(client, queue, nil)
	for _, id := range []string{"t1", "t2", "t3"} {
		require.NoError(t, enq.Enqueue(ctx, id, jobs.PriorityNormal, time.Time{}))
	}
	w := redistest.NewWire(t)
	h := newWakeHook(w.Client, queue, time.Minute, nil, nil)
	h.concurrency = 40
	require.NoError(t, h.dequeue(ctx, nil, dequeueCmd(), queue))
	require.NoError(t, h.giveBack(ctx, []string{"t2", "t3", "0123456789abcdef0123456789abcdef01234567"}))
	got := w.EvalSHAs(t, strings.NewReplacer(queue, "Q"))
	require.Equal(t, []string{
		"evalsha | 617b77722f4fcafdd649277378047b44d2ef268d | 4 | asynq:{Q}:paused | asynq:{Q}:pending | asynq:{Q}:active | asynq:{Q}:lease | 1893499230 | asynq:{Q}:t: | 16",
		"evalsha | 832933ca1fec92b06cb1f1853b4324834fe01faf | 3 | asynq:{Q}:active | asynq:{Q}:lease | asynq:{Q}:pending | asynq:{Q}:t: | t2 | t3 | 0123456789abcdef0123456789abcdef01234567",
	}, got)
}

// TestWakeHook_GiveBackAllocs pins the allocations of a give-back of four tasks (no longer
// active: left alone, the reply the same each time): with each id boxed, 11; the bound is the
// count with the ids copied into one buffer (redisscript.Args), which grows once for four.
func TestWakeHook_GiveBackAllocs(t *testing.T) { // not parallel: testing.AllocsPerRun
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops go-redis's pooled buffers at random")
	}
	ctx := context.Background()
	url := redistest.URL()
	queue := redistest.Queue(t, url)
	h := newWakeHook(redistest.ClientOf(t, url), queue, time.Minute, nil, nil)
	ids := []string{"0123456789abcdef0123456789abcdef01234567", "0123456789abcdef0123456789abcdef01234568",
		"0123456789abcdef0123456789abcdef01234569", "0123456789abcdef0123456789abcdef0123456a"}
	require.NoError(t, h.giveBack(ctx, ids)) // the connection, and the script cached
	allocs := testing.AllocsPerRun(200, func() {
		if err := h.giveBack(ctx, ids); err != nil {
			panic(err)
		}
	})
	t.Logf("giveBack: %.1f allocations", allocs)
	require.LessOrEqual(t, allocs, 9.0, "allocations per give-back")
}
