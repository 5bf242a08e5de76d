package limiter

import (
	"context"
	"errors"
	"fmt"

	"github.com/llmq/llmq/internal/redisscript"
)

// RecordAttempt counts one first attempt of a job on the credential (not a retry): the base the
// retry budget is a fraction of. It returns an error only when Redis fails.
func (c *Gate) RecordAttempt(ctx context.Context) error {
	if _, err := c.budget(ctx, "first", "", nil, nil); err != nil {
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
// refusal), and "" counts every refusal. A named retry draws once a window: asked for again
// within the window of its grant (by any process), it is granted again without drawing, so that
// a call go-redis sends again after its reply was lost, or a delivery that comes back for the
// same retry before sending it, spends one retry; and a refusal whose reply was lost is counted
// by the call sent again. It returns an error only when Redis fails.
func (c *Gate) AllowRetry(ctx context.Context, retry string) (bool, error) {
	ok, err := c.budget(ctx, "retry", retry, nil, nil)
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
	ok, err := c.budget(ctx, "timeout", retry, nil, nil)
	if err != nil {
		return false, fmt.Errorf("allow timeout retry: %w", err)
	}
	return ok, nil
}

// RetryAllowed says whether AllowRetry would allow one retry now, without drawing on the budget:
// a look, for a retry that must take something else first (its fair-queueing slot) and draws
// only once it has it. A false answer is a refusal, counted as AllowRetry counts one (once per
// retry, by its name), and takes the retry's ticket out of lane, when not nil (Lane.Ticket;
// retry must then be named): a retry the budget refuses holds no place in the fair queue, where
// its place (Lane.Since, its job's creation time) would be ahead of its tenant's newer jobs. It
// takes the same place again when it asks for a slot next. True promises nothing: the draw may
// still be refused, by the retries of other processes drawing in between; a retry granted within
// the window is allowed (its draw is granted again, see AllowRetry). It returns an error only
// when Redis fails, or for an invalid lane.
func (c *Gate) RetryAllowed(ctx context.Context, retry string, lane *Lane) (bool, error) {
	ok, err := c.look(ctx, "look:retry", retry, lane)
	if err != nil {
		return false, fmt.Errorf("look at the retry budget: %w", err)
	}
	return ok, nil
}

// TimeoutRetryAllowed is RetryAllowed for AllowTimeoutRetry's allowance.
func (c *Gate) TimeoutRetryAllowed(ctx context.Context, retry string, lane *Lane) (bool, error) {
	ok, err := c.look(ctx, "look:timeout", retry, lane)
	if err != nil {
		return false, fmt.Errorf("look at the timeout retry budget: %w", err)
	}
	return ok, nil
}

// look runs budget's look of kind, taking the ticket of a refused retry out of lane (not nil).
func (c *Gate) look(ctx context.Context, kind, retry string, lane *Lane) (bool, error) {
	if lane == nil {
		return c.budget(ctx, kind, retry, nil, nil)
	}
	if err := lane.valid(); err != nil {
		return false, err
	}
	if retry == "" {
		return false, errors.New("a look with a lane needs the retry's name")
	}
	p := c.l.cfg.Prefix
	return c.budget(ctx, kind, retry, []string{fairLaneKey(p, c.tag) + lane.name(), fairDeadlineKey(p, c.tag)},
		[]any{lane.name(), lane.Ticket})
}

// budget runs budgetScript for kind ("first", "retry", "timeout", or a look: "look:retry",
// "look:timeout"); a refusal of a retry (named retry, or "") is counted in the refusals metric
// when the script says it is the retry's first. laneKeys and laneArgs, with a named retry, are
// budgetScript's KEYS[3..4] and ARGV[8..9] (nil: none).
func (c *Gate) budget(ctx context.Context, kind, retry string, laneKeys []string, laneArgs []any) (bool, error) {
	ca := &c.l.args
	keys := []string{budgetKey(c.l.cfg.Prefix, c.tag)}
	args := []any{c.l.nowArg(), kind, ca.budgetWindow, ca.budgetBuckets, ca.budgetRatio, ca.budgetFloor}
	if retry != "" {
		// A named retry's call carries an id: a refusal it counted is told again to the call
		// go-redis sends again after its reply was lost (see budgetScript).
		var a redisscript.Args
		args[0] = a.NowCall(c.l.cfg.Now, c.l.calls)
		keys = append(keys, refusedKey(c.l.cfg.Prefix, c.tag))
		args = append(args, retry)
		keys, args = append(keys, laneKeys...), append(args, laneArgs...)
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
