package redistest_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/redistest"
)

// keysMatching counts the keys matching pattern on every node of the Redis behind c.
func keysMatching(t *testing.T, c redis.UniversalClient, pattern string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	count := func(ctx context.Context, node redis.Cmdable) int {
		keys, err := node.Keys(ctx, pattern).Result()
		require.NoError(t, err)
		return len(keys)
	}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return count(ctx, c)
	}
	n := 0
	for _, addr := range clusterAddrs(t, cc) {
		node := redis.NewClient(&redis.Options{Addr: addr})
		n += count(ctx, node)
		_ = node.Close()
	}
	return n
}

// clusterAddrs lists the addresses of the cluster's masters.
func clusterAddrs(t *testing.T, cc *redis.ClusterClient) []string {
	t.Helper()
	var (
		mu    sync.Mutex
		addrs []string
	)
	// ForEachMaster calls fn on the masters concurrently.
	require.NoError(t, cc.ForEachMaster(t.Context(), func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		addrs = append(addrs, node.Options().Addr)
		return nil
	}))
	return addrs
}

// The prefix of a test is removed from every node when the test ends, whichever slots its keys
// fell in (on a cluster, a SCAN reaches one node and an UNLINK of keys of several slots is
// refused).
func TestPrefixOn_RemovesEveryKeyOnEveryNode(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		c := redistest.ClientOf(t, target.URL)
		var prefix string
		t.Run("Writes", func(t *testing.T) {
			prefix = redistest.PrefixOn(t, target.URL)
			for i := range 600 { // more than one SCAN page and one UNLINK batch
				require.NoError(t, c.Set(t.Context(), prefix+strconv.Itoa(i), i, time.Minute).Err())
			}
			require.Equal(t, 600, keysMatching(t, c, prefix+"*"))
			if target.Name == "Cluster" {
				require.Len(t, clusterAddrs(t, c.(*redis.ClusterClient)), 3)
			}
		})
		require.Zero(t, keysMatching(t, c, prefix+"*"))
	})
}

// A test's asynq queue leaves nothing behind: its tasks, their counters and its entry in
// asynq's list of queues.
func TestQueue_LeavesNothingBehind(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		c := redistest.ClientOf(t, target.URL)
		var queue string
		t.Run("Enqueues", func(t *testing.T) {
			queue = redistest.Queue(t, target.URL)
			opt, err := dispatch.RedisConnOpt(target.URL)
			require.NoError(t, err)
			client := asynq.NewClient(opt)
			defer client.Close()
			for _, q := range []string{queue, queue + ":low"} {
				for i := range 3 {
					_, err := client.EnqueueContext(t.Context(), asynq.NewTask("t", nil), asynq.Queue(q),
						asynq.TaskID(strconv.Itoa(i)), asynq.Retention(time.Minute))
					require.NoError(t, err)
				}
				require.Positive(t, keysMatching(t, c, "asynq:{"+q+"}:*"))
				in, err := c.SIsMember(t.Context(), "asynq:queues", q).Result()
				require.NoError(t, err)
				require.True(t, in)
			}
		})
		for _, q := range []string{queue, queue + ":low"} {
			require.Zero(t, keysMatching(t, c, "asynq:{"+q+"}:*"))
			in, err := c.SIsMember(t.Context(), "asynq:queues", q).Result()
			require.NoError(t, err)
			require.False(t, in)
		}
	})
}

// A private cluster is a working three-master cluster, and FlushAll empties all of it.
func TestClusterServer_FlushAllEmptiesEveryMaster(t *testing.T) {
	t.Parallel()
	c := redistest.ClientOf(t, redistest.ClusterServer(t))
	cc := c.(*redis.ClusterClient)
	require.Len(t, clusterAddrs(t, cc), 3)
	for i := range 100 {
		require.NoError(t, c.Set(t.Context(), "k"+strconv.Itoa(i), i, 0).Err())
	}
	require.Equal(t, 100, keysMatching(t, c, "*"))
	require.NoError(t, redistest.FlushAll(t.Context(), c))
	n, err := c.DBSize(t.Context()).Result()
	require.NoError(t, err)
	require.Zero(t, n)
}
