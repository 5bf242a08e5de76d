package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/tokens"
)

// TokenBucket is one token bucket as the limiter knows it.
type TokenBucket struct {
	// PerMinute is the bucket's capacity (and its refill per Config.TokenMinute); 0: unknown.
	PerMinute float64
	// Rate is the refill rate paced at, in tokens per second, without margins. For a learned
	// limit it is at least PerMinute per TokenMinute, more when the headers prove it.
	Rate float64
	// Source is where the limit comes from.
	Source Source
}

// TokenBuckets is a credential's token buckets.
type TokenBuckets struct {
	Input, Output, Combined TokenBucket
}

// parseTokenLimits reads the scripts' "capacity rate source" triples (input, output, combined),
// as strings.SplitN(s, ",", 3) and strings.Fields split them (a part of other than three fields
// is unknown), without allocating: it reads every reservation's reply.
func parseTokenLimits(s string) TokenBuckets {
	if s == "" {
		return TokenBuckets{}
	}
	var out [3]TokenBucket
	rest := s
	for i := range out {
		part, more, found := strings.Cut(rest, ",")
		if i == len(out)-1 {
			part = rest // the last part holds any further commas
		}
		out[i] = parseTokenBucket(part)
		if !found {
			break
		}
		rest = more
	}
	return TokenBuckets{Input: out[0], Output: out[1], Combined: out[2]}
}

// parseTokenBucket reads one "capacity rate source" triple, its fields split as strings.Fields
// splits them; a part of other than three fields is the zero TokenBucket.
func parseTokenBucket(part string) TokenBucket {
	var f [3]string
	n := 0
	for field := range strings.FieldsSeq(part) {
		if n == len(f) {
			return TokenBucket{}
		}
		f[n] = field
		n++
	}
	if n != len(f) {
		return TokenBucket{}
	}
	c, _ := strconv.ParseFloat(f[0], 64)
	r, _ := strconv.ParseFloat(f[1], 64)
	return TokenBucket{PerMinute: c, Rate: r, Source: Source(f[2])}
}

// CheckCost returns a *tokens.TooLargeError when cost exceeds a token bucket configured in l (see
// tokens.Limits.Check), else nil. Pure: use it at submit time.
func (l Limit) CheckCost(cost tokens.Cost) error { return l.tokenLimits().Check(cost) }

// configured is l's configured capacity of bucket b, per minute (0: none configured).
func (l Limit) configured(b tokens.Bucket) float64 {
	switch b {
	case tokens.BucketInput:
		return l.InputTokensPerMinute
	case tokens.BucketOutput:
		return l.OutputTokensPerMinute
	case tokens.BucketTokens:
		return l.TokensPerMinute
	}
	return 0
}

// tokenLimits is l's configured token buckets.
func (l Limit) tokenLimits() tokens.Limits {
	return tokens.Limits{InputPerMinute: l.InputTokensPerMinute, OutputPerMinute: l.OutputTokensPerMinute,
		CombinedPerMinute: l.TokensPerMinute}
}

// CheckCost is Limit.CheckCost against lim's configured token limits and, for the buckets lim
// does not configure, the limits learned from the provider. It returns a *tokens.TooLargeError, nil, or
// an error when Redis fails.
func (c *Gate) CheckCost(ctx context.Context, lim Limit, cost tokens.Cost) error {
	if err := lim.CheckCost(cost); err != nil {
		return err
	}
	cur, err := c.CurrentTokenBuckets(ctx)
	if err != nil {
		return err
	}
	learned := func(configured float64, t TokenBucket) float64 {
		if configured == 0 && t.Source == SourceLearned {
			return t.PerMinute
		}
		return 0
	}
	err = Limit{
		InputTokensPerMinute:  learned(lim.InputTokensPerMinute, cur.Input),
		OutputTokensPerMinute: learned(lim.OutputTokensPerMinute, cur.Output),
		TokensPerMinute:       learned(lim.TokensPerMinute, cur.Combined),
	}.CheckCost(cost)
	var tl *tokens.TooLargeError
	if errors.As(err, &tl) {
		tl.Learned = true
	}
	return err
}

// ReserveCost is Reserve for a request that also costs tokens: atomically with the request slot
// (one Lua script), it takes cost from each token bucket that is configured in lim or learned
// from the provider's headers (see Observation), as GCRA on tokens: a full bucket lets its whole
// capacity go at once, then tokens go at the bucket's rate, and the slot's SendAt is the latest of
// what the request bucket and the token buckets allow (a bucket that waits for a refill keeps the
// phase margin). Buckets neither configured nor learned are not limited. With a zero cost it is
// Reserve.
//
// The costs are estimates: after the answer, Reconcile r.Grant with the usage the provider
// reported, so that the buckets track the provider's own count. While Config.TokenHorizon is
// set, a slot the tokens push beyond it is not handed out while another such slot is pending
// (Granted false: ask again after Wait), so that refunds apply to the queue.
//
// It returns a *tokens.TooLargeError (matching tokens.ErrTooLarge) when cost exceeds the whole capacity of a
// known bucket (nothing is reserved: the request can never be sent), and an error when lim or
// cost is invalid or Redis fails.
func (c *Gate) ReserveCost(ctx context.Context, lim Limit, cost tokens.Cost) (Reservation, error) {
	return c.ReserveAttempt(ctx, lim, cost, AttemptOptions{})
}

// ReserveAttempt is ReserveCost that also does opts' duties in the same atomic script: with
// Circuit, a breaker that is not closed and warm refuses first (Reservation.CircuitRefused); with
// UnlessPaused, a paused credential is refused (Reservation.Paused) before anything is reserved;
// with FirstAttempt, a granted slot counts a first attempt in the retry budget, as RecordAttempt
// would. Errors are ReserveCost's.
func (c *Gate) ReserveAttempt(ctx context.Context, lim Limit, cost tokens.Cost, opts AttemptOptions) (Reservation, error) {
	if !lim.valid() {
		return Reservation{}, fmt.Errorf("reserve: invalid limit %+v", lim)
	}
	if cost.InputTokens < 0 || cost.OutputTokens < 0 || cost.MinInputTokens < 0 {
		return Reservation{}, fmt.Errorf("reserve: invalid cost %+v", cost)
	}
	return c.reserve(ctx, lim, cost, opts)
}

// AcquireCost is Acquire with ReserveCost: it calls ReserveCost until a slot is granted, sleeping
// between calls while each wait to ask again is at most maxWait, and returns an ungranted
// Reservation when the next ask is further away. Errors are ReserveCost's, or ctx's.
func (c *Gate) AcquireCost(ctx context.Context, lim Limit, cost tokens.Cost, maxWait time.Duration) (Reservation, error) {
	return c.AcquireAttempt(ctx, lim, cost, maxWait, AttemptOptions{})
}

// AcquireAttempt is AcquireCost with ReserveAttempt's duties (opts): it also returns, at once,
// the refusal of a paused credential (Reservation.Paused, Reservation.PauseUnknown) or of a
// circuit breaker that is not closed and warm (Reservation.CircuitRefused).
func (c *Gate) AcquireAttempt(ctx context.Context, lim Limit, cost tokens.Cost, maxWait time.Duration, opts AttemptOptions) (Reservation, error) {
	for {
		r, err := c.ReserveAttempt(ctx, lim, cost, opts)
		if err != nil || r.Granted || r.Paused.Paused || r.PauseUnknown || r.CircuitRefused || r.Wait > maxWait {
			return r, err
		}
		t := time.NewTimer(r.Wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return Reservation{}, fmt.Errorf("acquire: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

// Reconcile trues the tokens of grant (Reservation.Grant) up to actual, what the provider charged:
// the usage it reported, as the provider's limits count it (input_tokens, with Anthropic's
// cache_creation_input_tokens but not its cache reads: llm.Usage.LimitedInput; output_tokens).
// A charge (more than reserved) moves the buckets' later send times later by exactly the
// difference; a refund moves them earlier, except that a slot already handed out keeps its tokens
// in the bucket. Call it once per grant; a grant already reconciled, or older than the 4,096 most
// recent, is ignored (nil). Without usage, pass what the provider is known to have charged: after
// an error answer, the input tokens and no output (tokens.Cost{InputTokens: r.Cost.InputTokens});
// after a 429, nothing (tokens.Cost{}); when no answer came, do not call it (the reservation stays
// charged). Grant 0 is a no-op. It returns an error only when actual is negative or Redis fails.
func (c *Gate) Reconcile(ctx context.Context, grant int64, actual tokens.Cost) error {
	call, ok, err := c.ReconcileCall(grant, actual)
	if err != nil || !ok {
		return err
	}
	return redisscript.Run(ctx, c.l.rdb, call)
}

// ReconcileCall returns Reconcile's work as a script call, for a caller that sends it in one round
// trip with others (redisscript.Run on the limiter's Redis); ok is false when there is nothing to
// send (grant 0). It returns an error only when actual is negative.
func (c *Gate) ReconcileCall(grant int64, actual tokens.Cost) (call redisscript.Call, ok bool, err error) {
	if actual.InputTokens < 0 || actual.OutputTokens < 0 {
		return call, false, fmt.Errorf("reconcile tokens: invalid cost %+v", actual)
	}
	if grant <= 0 {
		return call, false, nil
	}
	cfg := &c.l.cfg
	var a redisscript.Args // the arguments formatted into one buffer
	return redisscript.Call{
		Script: reconcileScript,
		Keys:   c.keys.tokenGrant,
		Args: []any{a.Now(cfg.Now), a.Int(grant), a.Int(int64(actual.InputTokens)), a.Int(int64(actual.OutputTokens)),
			c.l.args.learnTTL},
		Done: func(_ context.Context, cmd *redis.Cmd) error {
			res, err := cmd.Slice()
			if err != nil {
				return fmt.Errorf("reconcile tokens: %w", err)
			}
			if len(res) == 4 && redisscript.Int(res[0]) == 1 {
				c.series.reconciled(actual)
			}
			return nil
		},
	}, true, nil
}

// CurrentTokenBuckets returns the token limits in force for the credential: per bucket, the capacity a
// ReserveCost configured within LearnTTL, else the one learned from the headers, else unknown. It
// returns an error only when Redis fails.
func (c *Gate) CurrentTokenBuckets(ctx context.Context) (TokenBuckets, error) {
	cfg := &c.l.cfg
	s, err := currentTokensScript.Run(ctx, c.l.rdb, []string{tokenKey(cfg.Prefix, c.tag)},
		c.l.nowArg(), micros(cfg.LearnTTL), micros(cfg.TokenMinute)).Text()
	if err != nil {
		return TokenBuckets{}, fmt.Errorf("current token limits: %w", err)
	}
	return parseTokenLimits(s), nil
}

// TokenObservation is what a response said about one token bucket.
type TokenObservation struct {
	// Known reports that Limit and Remaining were present.
	Known bool
	// Limit is the bucket's capacity in tokens (per minute).
	Limit int
	// Remaining is the tokens left after this request.
	Remaining int
	// RemainingGranularity is how coarsely Remaining is reported: Anthropic rounds to the nearest
	// thousand (1000); 0 or 1 means exact (rounded down).
	RemainingGranularity int
	// ResetAt is when the bucket is full again (zero: not given).
	ResetAt time.Time
	// ResetGranularity and ResetAbsolute are as in Observation.
	ResetGranularity time.Duration
	ResetAbsolute    bool
}

func (t TokenObservation) usable() bool { return t.Known && t.Limit > 0 && t.Remaining >= 0 }

// observeTokensCall is the call that learns the token buckets from o (see observeTokensScript);
// ok is false when o reports none.
func (c *Gate) observeTokensCall(o Observation, off clockOffset, now time.Time) (redisscript.Call, bool) {
	fams := []TokenObservation{o.InputTokens, o.OutputTokens, o.Tokens}
	known := false
	for _, f := range fams {
		known = known || f.usable()
	}
	if !known {
		return redisscript.Call{}, false
	}
	ca := &c.l.args
	var a redisscript.Args // the numbers formatted into one buffer
	args := make([]any, 0, 4+3*7+2)
	args = append(args, a.Now(c.l.cfg.Now), ca.learnTTL, ca.rateMargin, ca.tokenMinute)
	for _, f := range fams {
		if !f.usable() {
			args = append(args, 0, 0, 0, 0, 0, 0, 0)
			continue
		}
		var dtMax, dtMin time.Duration
		if !f.ResetAt.IsZero() {
			dtMax, dtMin = c.l.resetBounds(o, off, f.ResetAt, f.ResetGranularity, f.ResetAbsolute)
		}
		args = append(args, 1, a.Int(int64(f.Limit)), a.Int(int64(f.Remaining)),
			a.Int(int64(max(f.RemainingGranularity, 1))), a.Int(max(micros(dtMax), 0)), a.Int(micros(dtMin)),
			a.Int(min(micros(o.SentAt.Sub(now)), 0)))
	}
	args = append(args, a.Int(o.Grant), grantsKept)
	return redisscript.Call{Script: observeTokensScript, Keys: c.keys.tokenGrant, Args: args,
		Done: func(_ context.Context, cmd *redis.Cmd) error {
			if err := cmd.Err(); err != nil {
				return fmt.Errorf("observe token limits: %w", err)
			}
			return nil
		}}, true
}
