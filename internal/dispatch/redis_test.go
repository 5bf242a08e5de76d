package dispatch_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
)

// holdingProxy is a TCP proxy to Redis that holds back the replies on every connection that has
// carried marker, until release: a round trip that takes as long as the test wants.
type holdingProxy struct {
	*redistest.Proxy
	release chan struct{}
}

func startHoldingProxy(t *testing.T, marker []byte) *holdingProxy {
	t.Helper()
	p := &holdingProxy{release: make(chan struct{})}
	p.Proxy = redistest.NewProxy(t,
		func(c *redistest.ProxyConn, b []byte) { // a command with the marker holds the replies
			if bytes.Contains(b, marker) {
				c.Marked.Store(true)
			}
		},
		func(c *redistest.ProxyConn, _ []byte) {
			if c.Marked.Load() {
				<-p.release
			}
		})
	t.Cleanup(p.unhold) // before the proxy closes: its pumps wait for the release
	return p
}

// unhold lets every held reply go.
func (p *holdingProxy) unhold() {
	select {
	case <-p.release:
	default:
		close(p.release)
	}
}

// clientHeldOn returns a client to Redis through a holdingProxy that holds the replies on every
// connection that has carried marker. When the test ends the replies go and the client closes.
func clientHeldOn(t *testing.T, marker string) (*redis.Client, *holdingProxy) {
	t.Helper()
	opt, err := redis.ParseURL(redistest.URL())
	require.NoError(t, err)
	proxy := startHoldingProxy(t, []byte(marker))
	opt.Addr = proxy.Addr()
	rdb := redis.NewClient(opt)
	t.Cleanup(func() {
		proxy.unhold()
		require.NoError(t, rdb.Close())
	})
	return rdb, proxy
}

// With more than one batch in flight, a command does not wait while an earlier batch's round
// trip is held up; with one (an ordered stream), it does. Each caller still gets its own reply.
func TestAutoPipelined_BatchesInFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		batches     int
		overtakes   bool
		description string
	}{
		{batches: 2, overtakes: true, description: "a second batch goes while the first is held"},
		{batches: 1, overtakes: false, description: "one ordered stream: the second waits for the first"},
	} {
		t.Run(tc.description, func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			slow := prefix + "slow"
			rdb, proxy := clientHeldOn(t, slow)
			ap := dispatch.AutoPipelined(rdb, tc.batches)
			_, isAP := ap.(*redis.AutoPipeliner)
			require.True(t, isAP, "a plain client gets an autopipeliner")
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			direct := redistest.Client(t)

			first := make(chan error, 1)
			go func() { first <- ap.Set(ctx, slow, "1", 0).Err() }()
			// The first batch is out once its reply is held: Redis has its key.
			require.Eventually(t, func() bool { return direct.Exists(ctx, slow).Val() == 1 },
				waitFor, time.Millisecond, "the first command reached Redis")

			second := make(chan error, 1)
			go func() { second <- ap.Set(ctx, prefix+"fast", "2", 0).Err() }()
			if tc.overtakes {
				select {
				case err := <-second:
					require.NoError(t, err)
				case <-ctx.Done():
					t.Fatal("the second command waited for the held batch")
				}
				select {
				case <-first:
					t.Fatal("the first command's reply was held")
				default:
				}
				proxy.unhold()
				require.NoError(t, <-first)
				return
			}
			// One ordered stream: the second command is sent only after the first batch's reply.
			// Its key stays absent while that reply is held (checked for a while: the
			// counterfactual, a second batch, sets it within a millisecond or so).
			require.Never(t, func() bool { return direct.Exists(ctx, prefix+"fast").Val() == 1 },
				200*time.Millisecond, 5*time.Millisecond, "the second command went before the first batch's reply")
			proxy.unhold()
			require.NoError(t, <-first)
			require.NoError(t, <-second)
		})
	}
}

// A client with no autopipeliner to give (a cluster client; a closed client, whose getters
// refuse) is returned as it is, by AutoPipelined and by Deferred alike.
func TestAutoPipelinedAndDeferred_ClientsWithoutOneAsTheyAre(t *testing.T) {
	t.Parallel()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer func() { require.NoError(t, cc.Close()) }()
	closed := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	require.NoError(t, closed.Close())
	for _, c := range []redis.UniversalClient{cc, closed} {
		require.Same(t, c, dispatch.AutoPipelined(c, 2))
		require.Same(t, c, dispatch.Deferred(c))
	}
}

// A command sent through Deferred returns before its reply: a submit's wake-up costs it no round
// trip. The command still reaches Redis, and its result, when read, is Redis's reply.
func TestDeferred_SendsWithoutWaitingForTheReply(t *testing.T) {
	t.Parallel()
	held := redistest.Prefix(t) + "held"
	rdb, proxy := clientHeldOn(t, held)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	direct := redistest.Client(t)

	sent := make(chan *redis.IntCmd, 1)
	go func() { sent <- dispatch.Deferred(rdb).ZAdd(ctx, held, redis.Z{Member: "q"}) }()
	var cmd *redis.IntCmd
	select {
	case cmd = <-sent:
	case <-ctx.Done():
		t.Fatal("the call waited for its reply")
	}
	require.Eventually(t, func() bool { return direct.ZScore(ctx, held, "q").Err() == nil },
		waitFor, time.Millisecond, "the command reached Redis while its reply is held")
	proxy.unhold()
	n, err := cmd.Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the result read is Redis's reply")
}

// An Enqueuer whose wake-up client is Deferred (the API's) returns once the task is enqueued,
// before the wake-up's reply: the submit waits for one round trip, not two. The wake-up is sent
// all the same.
func TestEnqueuer_DoesNotWaitForADeferredWakeUp(t *testing.T) {
	t.Parallel()
	queue := redistest.Queue(t, redistest.URL())
	aopt, err := dispatch.RedisConnOpt(redistest.URL())
	require.NoError(t, err)
	client := asynq.NewClient(aopt)
	defer func() { require.NoError(t, client.Close()) }()
	wakeSet := "asynq:{" + queue + "}:llmq-wake"
	rdb, _ := clientHeldOn(t, wakeSet)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	direct := redistest.Client(t)

	done := make(chan error, 1)
	go func() {
		done <- dispatch.NewEnqueuer(client, queue, dispatch.Deferred(rdb)).Enqueue(ctx, "job", jobs.PriorityNormal, time.Time{})
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the enqueue waited for its wake-up's reply")
	}
	require.Eventually(t, func() bool { return direct.ZScore(ctx, wakeSet, queue).Err() == nil },
		waitFor, time.Millisecond, "the wake-up reached Redis")
}

// GrowStacks' hook passes every command through unchanged: through the client, its
// autopipeliner and its deferred face, concurrent callers each get their own reply, and a
// command Redis refuses its own error.
func TestGrowStacks_RepliesAndErrorsPassThrough(t *testing.T) {
	t.Parallel()
	rdb := redistest.Client(t)
	dispatch.GrowStacks(rdb)
	ap := dispatch.AutoPipelined(rdb, 4)
	deferred := dispatch.Deferred(rdb)
	prefix := redistest.Prefix(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	const callers = 32
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			key := fmt.Sprintf("%sk%d", prefix, i)
			if err := ap.Set(ctx, key, i, 0).Err(); err != nil {
				errs <- err
				return
			}
			got, err := ap.Get(ctx, key).Int()
			if err == nil && got != i {
				err = fmt.Errorf("%s: got %d, want %d", key, got, i)
			}
			errs <- err
		}()
	}
	for range callers {
		select {
		case err := <-errs:
			require.NoError(t, err)
		case <-ctx.Done():
			t.Fatal("a caller got no reply")
		}
	}
	require.Equal(t, int64(1), deferred.Incr(ctx, prefix+"n").Val(), "a deferred command's reply")
	require.NoError(t, rdb.Set(ctx, prefix+"s", "text", 0).Err())
	require.Error(t, ap.Incr(ctx, prefix+"s").Err(), "Redis's refusal reaches its caller")
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, prefix+"p", "v", 0)
		return nil
	})
	require.NoError(t, err, "a pipeline passes through too")
	require.Equal(t, "v", rdb.Get(ctx, prefix+"p").Val())
}
