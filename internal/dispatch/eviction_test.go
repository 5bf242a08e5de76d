package dispatch_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/redistest"
)

// EvictionPolicy reads maxmemory-policy; on a Redis Cluster, one master that may evict is
// enough to answer its policy. A node without a memory limit (maxmemory 0, redis-server's
// default) never evicts, whatever its policy. Private deployments: the policy is never changed
// on a shared one.
func TestEvictionPolicy(t *testing.T) {
	t.Parallel()
	redistest.OnEach(t, func(t *testing.T, target redistest.Target) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		url := target.Private(t)
		opt, err := dispatch.RedisConnOpt(url)
		require.NoError(t, err)
		rdb := dispatch.NewRedisClient(opt)
		t.Cleanup(func() { _ = rdb.Close() })

		policy, err := dispatch.EvictionPolicy(ctx, rdb)
		require.NoError(t, err)
		require.Equal(t, dispatch.NoEviction, policy, "redis-server's default")

		// One node (of a cluster: one master) set to evict, without and then with a memory limit.
		for _, tc := range []struct{ maxmemory, want string }{
			{"0", dispatch.NoEviction}, // no memory limit: nothing is evicted
			{"1gb", "allkeys-lru"},
		} {
			set := func(ctx context.Context, c *redis.Client) error {
				if err := c.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err(); err != nil {
					return err
				}
				return c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err()
			}
			if cc, ok := rdb.(*redis.ClusterClient); ok {
				var done atomic.Bool
				require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
					if done.CompareAndSwap(false, true) {
						return set(ctx, c)
					}
					return nil
				}))
			} else {
				require.NoError(t, set(ctx, rdb.(*redis.Client)))
			}
			policy, err = dispatch.EvictionPolicy(ctx, rdb)
			require.NoError(t, err)
			require.Equal(t, tc.want, policy, "maxmemory %s", tc.maxmemory)
		}
	})
}
