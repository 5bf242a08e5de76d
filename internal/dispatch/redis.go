package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/gostack"
)

// RedisConnOpt parses a Redis URL for asynq: redis://, rediss://, redis-socket://,
// redis-sentinel:// (asynq's own forms) and redis-cluster://host:port,host:port. An error never
// quotes the URL, which may hold a password.
func RedisConnOpt(raw string) (asynq.RedisConnOpt, error) {
	if rest, ok := strings.CutPrefix(raw, "redis-cluster://"); ok {
		u, err := url.Parse("redis://" + rest)
		if err != nil {
			return nil, fmt.Errorf("parse redis cluster url: %w", withoutURL(err))
		}
		opt := asynq.RedisClusterClientOpt{Addrs: strings.Split(u.Host, ",")}
		if u.User != nil {
			opt.Username = u.User.Username()
			opt.Password, _ = u.User.Password()
		}
		return opt, nil
	}
	// Parsed here first: asynq's error for a URL that does not parse quotes it whole.
	if _, err := url.Parse(raw); err != nil {
		return nil, fmt.Errorf("parse redis url: %w", withoutURL(err))
	}
	opt, err := asynq.ParseRedisURI(raw)
	if err != nil {
		return nil, fmt.Errorf("parse redis url: %w", err)
	}
	return opt, nil
}

// withoutURL is a url.Parse error without the URL it quotes (its password with it): only what
// is wrong with it.
func withoutURL(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}

// NewRedisClient returns a go-redis client for the same Redis as opt (for the limiter and
// health checks). The caller closes it.
func NewRedisClient(opt asynq.RedisConnOpt) redis.UniversalClient {
	return opt.MakeRedisClient().(redis.UniversalClient)
}

// Deferred returns rdb's deferred autopipeliner (go-redis's async face; closed with rdb) when it
// has one: a command call returns at once, and the command goes in the next batch of one ordered
// stream, so that a caller sends what it needs no answer to without waiting for a round trip.
// Reading a command's result waits for it. It returns rdb itself for clients without one, whose
// calls wait.
func Deferred(rdb redis.UniversalClient) redis.Cmdable {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return rdb
	}
	ap, err := c.AsyncAutoPipeline()
	if err != nil {
		return rdb
	}
	return ap
}

// AutoPipelined returns rdb's blocking autopipeliner (closed with rdb) when it has one: every
// call still waits for its own reply, but the calls of concurrent goroutines share round trips.
// It returns rdb itself for clients without one.
//
// batches is how many batches may be in flight at once. 1 keeps every caller's commands in one
// ordered stream: a command waits while the batch before it makes its round trip. More lets it
// go at once, in no order between batches; that is safe where each caller waits for a reply
// before its next command (as the blocking face makes it, unless the caller stops waiting when
// its context ends: a command it sends after that may run before the one it gave up on). The
// autopipeliner is kept by rdb: a second call gets the first one's, whatever its batches.
func AutoPipelined(rdb redis.UniversalClient, batches int) redis.UniversalClient {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return rdb
	}
	opts := redis.DefaultBlockingAutoPipelineOptions()
	if batches > 1 {
		opts.MaxConcurrentBatches, opts.Unordered = batches, true
	}
	ap, err := c.AutoPipelineWithOptions(opts)
	if err != nil {
		return rdb
	}
	return ap
}

// GrowStacks adds a hook to rdb (call it once per client) that grows the stack of the goroutine
// running each of its commands (see gostack) before the client's deep paths (its writer, its
// reader, the push notifications' check) run on it. An autopipeliner sends each batch from a
// goroutine it starts for that batch, which otherwise grew its stack by doubling there, deep and
// dear to copy: in the API, most of the instructions a job spent copying stacks (callgrind). On a
// goroutine with room to spare it costs the clearing of gostack.Room bytes; on one that has used
// more than half of its stack when it calls, it doubles that stack. So it suits a client whose
// commands go from such batch goroutines or from shallow ones: the API's (its enqueues and
// wake-ups), not a worker's, whose deliveries call deep (measured there, it added to the
// copying).
func GrowStacks(rdb redis.UniversalClient) {
	rdb.AddHook(growStack{})
}

// growStack is GrowStacks' hook.
type growStack struct{}

func (growStack) DialHook(next redis.DialHook) redis.DialHook { return next }

func (growStack) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		gostack.Grow()
		return next(ctx, cmd)
	}
}

func (growStack) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		gostack.Grow()
		return next(ctx, cmds)
	}
}
