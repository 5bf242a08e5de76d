package limiter

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/internal/redisscript"
)

// RecordAttempt counts one first attempt of a job on the credential (not a retry): the base the
// retry budget is a fraction of. It returns an error only when Redis fails.
func (c *Gate) RecordAttempt(ctx context.Context) error {
	if _, err := c.budget(ctx, "first"); err != nil {
		return fmt.Errorf("record attempt: %w", err)
	}
	return nil
}

// AllowRetry asks the shared retry budget for one retry and, when it answers true, counts it, in
// one atomic step: within the sliding window, granted retries never exceed
// Budget.Floor + Budget.Ratio × first attempts, across all processes. False means over budget:
// defer the retry (do not send it). It returns an error only when Redis fails.
func (c *Gate) AllowRetry(ctx context.Context) (bool, error) {
	ok, err := c.budget(ctx, "retry")
	if err != nil {
		return false, fmt.Errorf("allow retry: %w", err)
	}
	if !ok {
		c.series.refused()
	}
	return ok, nil
}

// AllowTimeoutRetry is AllowRetry for a retry after a timeout. Timeouts are the normal failure
// of long generations, so they draw on an allowance of their own (the same Floor + Ratio × first
// attempts, counted separately): a run of slow answers cannot starve the retries of real errors,
// nor the other way round. It returns an error only when Redis fails.
func (c *Gate) AllowTimeoutRetry(ctx context.Context) (bool, error) {
	ok, err := c.budget(ctx, "timeout")
	if err != nil {
		return false, fmt.Errorf("allow timeout retry: %w", err)
	}
	if !ok {
		c.series.refused()
	}
	return ok, nil
}

func (c *Gate) budget(ctx context.Context, kind string) (bool, error) {
	ca := &c.l.args
	res, err := budgetScript.Run(ctx, c.l.rdb, []string{budgetKey(c.l.cfg.Prefix, c.tag)},
		c.l.nowArg(), kind, ca.budgetWindow, ca.budgetBuckets, ca.budgetRatio, ca.budgetFloor).Slice()
	if err != nil {
		return false, err
	}
	if len(res) != 3 {
		return false, fmt.Errorf("unexpected reply %v", res)
	}
	return redisscript.Int(res[0]) == 1, nil
}
