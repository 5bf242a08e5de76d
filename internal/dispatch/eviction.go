package dispatch

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// NoEviction is the maxmemory-policy under which Redis refuses writes at its memory limit
// instead of evicting keys: the only one that keeps llmq's state (asynq's tasks, the limiter's
// buckets, the pauses) from being dropped without a word.
const NoEviction = "noeviction"

// EvictionPolicy returns the maxmemory-policy of the Redis rdb reaches (CONFIG GET), or
// NoEviction for a Redis without a memory limit (maxmemory 0), which never evicts whatever its
// policy: on a Redis Cluster, the first master's that is not NoEviction, or NoEviction when all
// are. Its error is Redis's: CONFIG refused (a managed Redis often renames or forbids it), or no
// answer.
func EvictionPolicy(ctx context.Context, rdb redis.UniversalClient) (string, error) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return evictionPolicy(ctx, rdb)
	}
	var mu sync.Mutex
	policy := NoEviction
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		p, err := evictionPolicy(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if p != NoEviction {
			policy = p
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return policy, nil
}

// evictionPolicy is EvictionPolicy for one node: maxmemory and maxmemory-policy in one round
// trip (the pattern matches a few more settings, unread).
func evictionPolicy(ctx context.Context, c redis.Cmdable) (string, error) {
	m, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return "", fmt.Errorf("read maxmemory-policy: %w", err)
	}
	p, ok := m["maxmemory-policy"]
	if !ok {
		return "", fmt.Errorf("read maxmemory-policy: not in CONFIG GET's answer")
	}
	if m["maxmemory"] == "0" {
		return NoEviction, nil
	}
	return p, nil
}
