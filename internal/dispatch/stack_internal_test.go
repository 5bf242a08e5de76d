package dispatch

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/gostack"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// deepCall stands for go-redis's deep path under a command (its pool, writer and reader): a
// frame of gostack.Room, which fits in the stack gostack.Grow gives (a few frames used) and not
// in a goroutine's starting stack.
//
//go:noinline
func deepCall(i int) byte {
	var b [gostack.Room]byte
	b[i] = 1
	return b[len(b)-1-i]
}

// stackMovesFor reports whether the calling goroutine's stack was copied elsewhere (grown) for
// a deep call: a local's address changes only then.
func stackMovesFor() bool {
	var local int
	before := uintptr(unsafe.Pointer(&local))
	deepCall(0)
	return uintptr(unsafe.Pointer(&local)) != before
}

// settleProbe is a hook that checks, on each asynq script call whose first key is the queue's
// active list (the Done, Retry or Requeue that settles a delivered task), whether the deep call
// under it would have grown the stack of the goroutine asynq settles the task on.
type settleProbe struct {
	active string
	moved  chan bool
}

func (settleProbe) DialHook(next redis.DialHook) redis.DialHook { return next }

func (settleProbe) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (p settleProbe) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 3 && args[3] == p.active {
			select {
			case p.moved <- stackMovesFor():
			default:
			}
		}
		return next(ctx, cmd)
	}
}

// TestServer_SettlesATaskOnAGrownStack: asynq settles each delivered task (its Done script) on a
// goroutine it starts for the task, whose first call is into go-redis's deep paths; the server
// grows that goroutine's stack first thing (its BaseContext), so the call does not copy a deep
// stack for every delivery (a worker's largest stack copy per job, callgrind). The control: a
// fresh goroutine's stack moves for the same call, else the test could not tell.
func TestServer_SettlesATaskOnAGrownStack(t *testing.T) {
	t.Parallel()
	control := make(chan bool, 1)
	go func() { control <- stackMovesFor() }()
	if !<-control {
		t.Skip("a fresh goroutine's stack did not move for the deep call: this runtime starts goroutines with room, the test cannot see a growth")
	}
	url := redistest.URL()
	r := newIdleWakeRig(t, url, time.Second, 2)
	probe := settleProbe{active: "asynq:{" + NewQueues(r.queue).For(jobs.PriorityNormal) + "}:active", moved: make(chan bool, 1)}
	r.srv.rdb.AddHook(probe)
	r.start(t)
	id := "job-" + redistest.Rand()
	require.NoError(t, r.enq.Enqueue(t.Context(), id, jobs.PriorityNormal, time.Time{}))
	require.Equal(t, id, r.next(t))
	select {
	case moved := <-probe.moved:
		require.False(t, moved, "the goroutine settling the task had its stack grown deep in go-redis")
	case <-time.After(30 * time.Second):
		t.Fatal("the delivered task was not settled within 30s")
	}
}
