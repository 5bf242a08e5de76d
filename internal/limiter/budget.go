package limiter

import (
	"context"
	"fmt"

	"github.com/llmq/llmq/internal/redisscript"
)

// RecordAttempt counts one first attempt of a job on the credential (not a retry): the base the
// retry budget is a fraction of. It returns an error only when Redis fails.
func (c *Gate) RecordAttempt(ctx context.Context) error {
	if _, err := c.budget(ctx, "first", ""); err != nil {
		return fmt.Errorf("record attempt: %w", err)
	}
	return nil
}

// AllowRetry asks the shared retry budget for one retry and, when it answers true, counts it, in
// one atomic step: within the sliding window, granted retries never exceed
// Budget.Floor + Budget.Ratio × first attempts, across all processes. False means over budget:
// defer the retry (do not send it). retry names the retry (its job and attempt, say): a refusal
// is counted in llmq_retry_budget_refusals_total once per retry, however often the retry is asked
// for again while the budget stays spent (by any process; asked again within a window of its last
// refusal), and "" counts every refusal. It returns an error only when Redis fails.
func (c *Gate) AllowRetry(ctx context.Context, retry string) (bool, error) {
	ok, err := c.budget(ctx, "retry", retry)
	if err != nil {
		return false, fmt.Errorf("allow retry: %w", err)
	}
	return ok, nil
}

// AllowTimeoutRetry is AllowRetry for a retry after a timeout. Timeouts are the normal failure
// of long generations, so they draw on an allowance of their own (the same Floor + Ratio × first
// attempts, counted separately): a run of slow answers cannot starve the retries of real errors,
// nor the other way round. It returns an error only when Redis fails.
func (c *Gate) AllowTimeoutRetry(ctx context.Context, retry string) (bool, error) {
	ok, err := c.budget(ctx, "timeout", retry)
	if err != nil {
		return false, fmt.Errorf("allow timeout retry: %w", err)
	}
	return ok, nil
}

// budget runs budgetScript for kind ("first", "retry", "timeout"); a refusal of a retry (named
// retry, or "") is counted in the refusals metric when the script says it is the retry's first.
func (c *Gate) budget(ctx context.Context, kind, retry string) (bool, error) {
	ca := &c.l.args
	keys := []string{budgetKey(c.l.cfg.Prefix, c.tag)}
	args := []any{c.l.nowArg(), kind, ca.budgetWindow, ca.budgetBuckets, ca.budgetRatio, ca.budgetFloor}
	if retry != "" {
		keys = append(keys, refusedKey(c.l.cfg.Prefix, c.tag))
		args = append(args, retry)
	}
	res, err := budgetScript.Run(ctx, c.l.rdb, keys, args...).Slice()
	if err != nil {
		return false, err
	}
	if len(res) != 4 {
		return false, fmt.Errorf("unexpected reply %v", res)
	}
	if redisscript.Int(res[3]) == 1 {
		c.series.refused()
	}
	return redisscript.Int(res[0]) == 1, nil
}
