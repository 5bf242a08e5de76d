package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/redisscript"
)

// Sent reports that the request of a slot granted with a non-zero Reservation.ReportSend (pass
// it as period) leaves now: once the burst's every slot is reported, the credential's schedule
// after the burst counts the provider's refill from when they left, not from their grants (see
// AttemptOptions.ReportSend). Call it just before sending, once per slot. It returns how much
// later the schedule moved (0 until the burst's last report), or an error when Redis fails (the
// slots after the burst then wait a second before going on their own). A report sent again after
// its reply was lost (go-redis's retry on a failed connection) counts once.
func (c *Gate) Sent(ctx context.Context, period int64) (time.Duration, error) {
	var a redisscript.Args // the arguments formatted into one buffer
	d, err := sentScript.Run(ctx, c.l.rdb, c.keys.rateToken, a.NowCall(c.l.cfg.Now, c.l.calls), a.Int(period)).Int64()
	if err != nil {
		return 0, fmt.Errorf("report send: %w", err)
	}
	return time.Duration(d) * time.Microsecond, nil
}

// appendAnchorArgs appends reserveScript's ARGV[28..41] for opts to args, the lane's formatted
// into a: the fairness arguments (empty without a Lane) and the ReportSend flag; nothing when
// neither is asked for.
func (c *Gate) appendAnchorArgs(args []any, a *redisscript.Args, opts AttemptOptions) []any {
	if opts.Lane != nil {
		args = c.appendFairArgs(args, a, opts.Lane)
	} else if opts.ReportSend {
		for range 13 {
			args = append(args, "")
		}
	}
	if opts.ReportSend {
		args = append(args, "1")
	}
	return args
}
