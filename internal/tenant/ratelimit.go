package tenant

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
)

// Rate is a request rate with a burst: Burst requests at once, then one every 1/PerSecond.
type Rate struct {
	PerSecond float64
	Burst     int
}

// RateLimiterConfig configures a RateLimiter.
type RateLimiterConfig struct {
	// Rate is every tenant's submit rate. Both fields are required (> 0).
	Rate Rate
	// Prefix starts the Redis keys. Default "llmq:"; tests isolate themselves with a prefix of
	// their own.
	Prefix string
	// Now is the clock. Nil (production): the script reads Redis TIME, so every replica shares
	// one clock whatever its own says.
	Now func() time.Time
}

// RateLimiter limits each tenant's submits with GCRA (a token bucket kept as one timestamp),
// in Redis, so the limit holds across every API replica. Safe for concurrent use.
type RateLimiter struct {
	rdb redis.UniversalClient
	cfg RateLimiterConfig
	// interval (the emission interval in µs, formatted) and burst are the script's arguments
	// that the configuration alone decides, formatted and boxed once.
	interval, burst any
}

// NewRateLimiter returns a RateLimiter, or an error naming the invalid field.
func NewRateLimiter(rdb redis.UniversalClient, cfg *RateLimiterConfig) (*RateLimiter, error) {
	if cfg == nil {
		return nil, errors.New("tenant rate limiter: config required")
	}
	c := *cfg
	if !(c.Rate.PerSecond > 0) || math.IsInf(c.Rate.PerSecond, 0) {
		return nil, fmt.Errorf("tenant rate limiter: requests_per_second must be positive (got %g)", c.Rate.PerSecond)
	}
	if c.Rate.Burst <= 0 {
		return nil, fmt.Errorf("tenant rate limiter: burst must be positive (got %d)", c.Rate.Burst)
	}
	if c.Prefix == "" {
		c.Prefix = "llmq:"
	}
	return &RateLimiter{rdb: rdb, cfg: c,
		interval: strconv.FormatFloat(1e6/c.Rate.PerSecond, 'f', -1, 64), burst: c.Rate.Burst}, nil
}

// Decision is the answer to one request.
type Decision struct {
	Allowed bool
	// RetryAfter is, when not allowed, how long until a request would be: at least 1µs.
	RetryAfter time.Duration
}

// RetryAfterSeconds is RetryAfter as the Retry-After header wants it: whole seconds, rounded up,
// at least 1.
func (d Decision) RetryAfterSeconds() int {
	return max(1, int(math.Ceil(d.RetryAfter.Seconds())))
}

// Allow counts one request of the tenant against its rate and says whether it may proceed. A
// refused request takes nothing from the bucket. It returns an error only when Redis fails.
func (l *RateLimiter) Allow(ctx context.Context, tenant string) (Decision, error) {
	var a redisscript.Args // the time formatted into it (none on Redis TIME)
	res, err := gcraScript.Run(ctx, l.rdb, []any{submitKey(l.cfg.Prefix, tenant)},
		a.Now(l.cfg.Now), l.interval, l.burst).Int64Slice()
	if err != nil {
		return Decision{}, fmt.Errorf("tenant rate limit: %w", err)
	}
	if res[0] == 1 {
		return Decision{Allowed: true}, nil
	}
	return Decision{RetryAfter: time.Duration(max(res[1], 1)) * time.Microsecond}, nil
}

// submitKey is the GCRA state of one tenant's submits (a string: the theoretical arrival time in
// µs). The tenant name is the hash tag, so a Cluster keeps it in one slot. It expires when the
// bucket is full again.
func submitKey(prefix, tenant string) string { return prefix + "tenant:{" + tenant + "}:submit" }

// gcraScript admits one request.
//
// KEYS[1] the tenant's GCRA key (theoretical arrival time, µs)
// ARGV[1] now µs, or "" for Redis TIME
// ARGV[2] emission interval µs (1e6 / rate)
// ARGV[3] burst
// Returns {1, 0} when admitted (the arrival time advanced), {0, wait µs} when not (unchanged).
var gcraScript = redisscript.NewScript(`
local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  pcall(redis.replicate_commands)
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local interval, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local newtat = tat + interval
local allowat = newtat - burst * interval
if now < allowat then
  return {0, math.ceil(allowat - now)}
end
redis.call('SET', KEYS[1], string.format('%.0f', newtat), 'PX', math.ceil((newtat - now) / 1000) + 1)
return {1, 0}
`)
