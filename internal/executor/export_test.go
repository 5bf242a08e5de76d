package executor

import (
	"context"
	"time"

	"github.com/llmq/llmq/internal/logthrottle"
)

// SetUnconfiguredLogAfterFunc replaces what schedules e's reports of credential_not_configured
// dead-letter lines held back (logthrottle.Throttle.SetAfterFunc): the test runs them.
func SetUnconfiguredLogAfterFunc(e *Executor, f logthrottle.TimerFunc) {
	e.unconfiguredLog.SetAfterFunc(f)
}

// BacklogWaiters returns how many deliveries of e wait for a place in its backlog gate now.
func BacklogWaiters(e *Executor) int {
	return int(e.backlog.waiting.Load())
}

// HeldSlots returns how many of e's delivery slots tenant holds in its share (Config.Slots).
func HeldSlots(e *Executor, tenant string) int { return e.shares.Held(tenant) }

// SetTurnAwaySleep replaces how e waits out the pause of a delivery turned away for its
// tenant's share (turnAwayPause): the test sees it and decides when it ends.
func SetTurnAwaySleep(e *Executor, f func(ctx context.Context, d time.Duration) error) {
	e.turnAwaySleep = f
}
