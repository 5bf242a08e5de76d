package limiter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/redisscript"
)

// PushBack is a push-back of a credential's shared schedule by a 429's Retry-After (see Observe):
// nobody sends on the credential before Until.
type PushBack struct {
	// Until is when a request may be sent again, on the limiter's clock; zero when no push-back
	// is in force.
	Until time.Time
	// At is when the 429 that set it was observed.
	At time.Time
	// RetryAfter is the wait the provider asked for.
	RetryAfter time.Duration
	// Applied is the wait honoured: RetryAfter capped at Config.MaxRetryAfter.
	Applied time.Duration
}

// Active reports whether a push-back is in force.
func (p PushBack) Active() bool { return !p.Until.IsZero() }

// Reason says why, for an operator: "Retry-After 300s from a 429", and ", capped at 300s" when
// the provider asked for more than Config.MaxRetryAfter.
func (p PushBack) Reason() string {
	if !p.Active() {
		return ""
	}
	why := "Retry-After " + seconds(p.RetryAfter) + " from a 429"
	if p.RetryAfter > p.Applied {
		why += ", capped at " + seconds(p.Applied)
	}
	return why
}

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" }

// PushBack returns the push-back in force on the credential's schedule (the zero PushBack when
// none). It returns an error only when Redis fails.
func (c *Gate) PushBack(ctx context.Context) (PushBack, error) {
	return c.pushBack(ctx, false)
}

// ClearPushBack ends the push-back in force, if any, and returns it (the zero PushBack when there
// was none): the next reservation is not held back by it, and a schedule it pushed back starts
// again from now, the bucket holding one request. Slots already handed out (jobs holding a send
// time at or after the push-back's end) keep their times. It returns an error only when Redis
// fails.
func (c *Gate) ClearPushBack(ctx context.Context) (PushBack, error) {
	return c.pushBack(ctx, true)
}

func (c *Gate) pushBack(ctx context.Context, clear bool) (PushBack, error) {
	res, err := pushBackScript.Run(ctx, c.l.rdb, c.keys.rateOnly,
		c.l.nowArg(), flag(clear)).Slice()
	if err != nil {
		return PushBack{}, fmt.Errorf("read push-back: %w", err)
	}
	if len(res) != 4 {
		return PushBack{}, fmt.Errorf("read push-back: unexpected reply %v", res)
	}
	until := redisscript.Int(res[0])
	if until == 0 {
		return PushBack{}, nil
	}
	return PushBack{Until: time.UnixMicro(until), At: time.UnixMicro(redisscript.Int(res[1])),
		RetryAfter: time.Duration(redisscript.Int(res[2])) * time.Microsecond,
		Applied:    time.Duration(redisscript.Int(res[3])) * time.Microsecond}, nil
}
