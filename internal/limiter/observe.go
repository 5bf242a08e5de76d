package limiter

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisscript"
)

// Observation is what one provider response (or failure) said about the limit.
// The worker builds it from llm.RateLimit, which parses both providers' headers.
type Observation struct {
	// At is when the response arrived. Zero means now.
	At time.Time
	// SentAt is when the request was sent. Zero means At. Giving it makes learning exact about
	// latency: the provider evaluated the request somewhere between SentAt and At.
	SentAt time.Time
	// StatusCode is the HTTP status; 0 for a request that got no response.
	StatusCode int
	// HeadersKnown reports that Limit, Remaining and ResetAt were present.
	HeadersKnown bool
	// Limit is the provider's request limit (the bucket's capacity, used as the burst).
	Limit int
	// Remaining is the requests left after this one.
	Remaining int
	// ResetAt is when the bucket is full again.
	ResetAt time.Time
	// ResetGranularity is how coarse ResetAt is. 0 means: a whole-second ResetAt is taken as
	// rounded to the second, anything else as exact.
	ResetGranularity time.Duration
	// ResetAbsolute reports that ResetAt was read from the provider's clock (Anthropic sends a
	// time, OpenAI a duration), so it is off by the clocks' difference: measured from Date when
	// the response has one, else Config.ClockSkew widens what it says.
	ResetAbsolute bool
	// Date is the response's Date header: the provider's clock when it answered, truncated to
	// the second (zero: none, or not valid). The provider stamped it between SentAt and At, so it
	// bounds how far the provider's clock is from ours; the limiter keeps, per credential and in
	// the process, what its responses' Dates prove together, and measures an absolute reset (this
	// one, and the token buckets') on it instead of assuming Config.ClockSkew.
	Date time.Time
	// RetryAfter is the wait a 429 asked for, when HasRetryAfter, as the provider said it: the
	// limiter caps the push-back at Config.MaxRetryAfter and remembers both.
	RetryAfter time.Duration
	// HasRetryAfter reports that the response carried Retry-After (or retry-after-ms).
	HasRetryAfter bool
	// TooLarge reports that the answer refused the request for its size, not for the rate:
	// OpenAI's 429 "Request too large for … on tokens per min (TPM)", a request larger than the
	// credential's whole tokens-per-minute limit. Such a 429 says nothing of the credential's
	// rate: it is taken as any other refusal, its rate-limit headers learned, but its Retry-After
	// does not push the schedule back, the learned rate is not cut, and lending ahead goes on.
	TooLarge bool
	// Seq is the Reservation.Seq of the attempt. It lets the limiter use what the provider says
	// remains (less the requests let out since) when that is more than its own schedule holds,
	// which is how a learned limit escapes pacing below the provider's true rate. 0 (unknown) is
	// safe: then every request let out so far is assumed still in flight.
	Seq int64
	// Grant is the Reservation.Grant of the attempt (0: none or unknown). It lets token learning
	// count the tokens granted after this attempt's (slots handed out that the provider had not
	// yet seen when it reported Remaining), so that resetting the schedule to the provider's count
	// does not forget them. 0 is safe only while nothing else is in flight.
	Grant int64
	// InputTokens is the provider's input-token bucket (Anthropic's
	// anthropic-ratelimit-input-tokens-*), when it reported one.
	InputTokens TokenObservation
	// OutputTokens is the provider's output-token bucket (anthropic-ratelimit-output-tokens-*).
	OutputTokens TokenObservation
	// Tokens is a bucket of input and output tokens together: OpenAI's x-ratelimit-*-tokens.
	// Leave Anthropic's anthropic-ratelimit-tokens-* out: it reports the most restrictive of its
	// token limits, not a bucket of its own, and would double-count.
	Tokens TokenObservation
}

// Observe feeds one response to the limiter; call it for every attempt Reserve let out,
// including failures without a response (it ends the probe of an unknown limit). It:
//   - learns the limit when headers are known: the burst is Limit, and each response bounds the
//     rate (see the package doc); a new Limit value, or a response inconsistent with the bounds,
//     starts learning afresh, so the limiter follows a provider that changes its limit mid-run;
//   - on a 429 with Retry-After (not one TooLarge), pushes the shared schedule back so that
//     nobody sends before At+min(RetryAfter, Config.MaxRetryAfter), and lowers the learned rate
//     by 10% (until responses say otherwise); PushBack reports it, ClearPushBack ends it;
//   - learns each token bucket the response reports (capacity = Limit; the refill rate is at
//     least Limit per Config.TokenMinute, more when deficit and reset prove it) and, unless the
//     bucket is configured, never lets the schedule hold fewer tokens than the provider surely
//     held (Limit - Remaining, less its rounding, from SentAt on). ReserveCost uses them.
//
// A 429 without Retry-After changes nothing here: it is a spend cap, see Pause. Observe returns
// an error only when Redis fails.
func (c *Gate) Observe(ctx context.Context, o Observation) error {
	return redisscript.Run(ctx, c.l.rdb, c.ObserveCalls(o)...)
}

// ObserveCalls returns Observe's work as script calls, for a caller that sends them in one round
// trip with others (redisscript.Run on the limiter's Redis), with room for two more appended. They
// hold the observation's times as of now; send them at once.
func (c *Gate) ObserveCalls(o Observation) []redisscript.Call {
	l := c.l
	now := l.localNow()
	if o.At.IsZero() {
		o.At = now
	}
	if o.SentAt.IsZero() || o.SentAt.After(o.At) {
		o.SentAt = o.At
	}
	off := l.offsets.observe(c.tag, o, l.cfg.LearnTTL)
	var dtMax, dtMin time.Duration
	hdr := 0
	if o.HeadersKnown && o.Limit > 0 {
		hdr = 1
		if !o.ResetAt.IsZero() {
			dtMax, dtMin = l.resetBounds(o, off, o.ResetAt, o.ResetGranularity, o.ResetAbsolute)
		}
	}
	cfg := &l.cfg
	// The arguments that change at every call are formatted into one buffer (redisscript.Args).
	var a redisscript.Args
	status := o.StatusCode
	if o.TooLarge && status == http.StatusTooManyRequests {
		// A refusal for size, not for the rate: the script's 429 rules (push-back, the rate cut,
		// no lending ahead) are not for it; it is any other refusal to them.
		status = http.StatusRequestEntityTooLarge
	}
	pushed := o.HasRetryAfter && status == http.StatusTooManyRequests
	var ra, asked, applied any = "", "", ""
	if pushed {
		wait := min(max(o.RetryAfter, 0), cfg.MaxRetryAfter)
		ra = a.Int(micros(o.At.Add(wait).Sub(now)))
		asked, applied = a.Int(micros(o.RetryAfter)), a.Int(micros(wait))
	}
	// Room for the token buckets' call and two of the caller's (the executor's reconciliation
	// and breaker): a list grown by each append was 3 allocations a job.
	calls := make([]redisscript.Call, 1, 4)
	calls[0] = redisscript.Call{
		Script: observeScript,
		Keys:   c.keys.rateOnly,
		Args: []any{a.NowCall(cfg.Now, l.calls), a.Int(int64(status)), a.Int(int64(hdr)), a.Int(int64(o.Limit)),
			a.Int(int64(o.Remaining)), a.Int(max(micros(dtMax), 0)), a.Int(micros(dtMin)),
			ra, l.args.learnTTL, l.args.rateDecrease, a.Int(o.Seq), l.args.learnTTL, asked, applied,
			a.Int(micros(o.SentAt.Sub(now)))},
		Done: func(_ context.Context, cmd *redis.Cmd) error {
			if err := cmd.Err(); err != nil {
				return fmt.Errorf("observe response: %w", err)
			}
			if pushed {
				c.series.pushedBack()
			}
			return nil
		},
	}
	if tc, ok := c.observeTokensCall(o, off, now); ok {
		calls = append(calls, tc)
	}
	return calls
}

// resetBounds returns how long after o.SentAt a bucket reported full at reset is full at the
// latest (dtMax), and how long after o.At at the earliest (dtMin). granularity is how coarse reset
// is (0: a whole-second reset is taken as truncated to the second, anything else as exact);
// absolute reports that reset is on the provider's clock, off ours by off when off.known, else
// by up to Config.ClockSkew either way.
func (l *Limiter) resetBounds(o Observation, off clockOffset, reset time.Time, granularity time.Duration, absolute bool) (dtMax, dtMin time.Duration) {
	q := granularity
	if q == 0 && reset.Nanosecond() == 0 {
		q = time.Second
	}
	lo, hi := time.Duration(0), time.Duration(0)
	switch {
	case absolute && off.known:
		lo, hi = off.lo, off.hi
	case absolute:
		lo, hi = -l.cfg.ClockSkew, l.cfg.ClockSkew
	}
	// The provider's bucket is full at some R (our clock) within [reset-hi, reset+q-lo): a
	// coarse reset is taken as truncated.
	return reset.Add(q - lo).Sub(o.SentAt), reset.Add(-hi).Sub(o.At)
}

// clockOffset is what Date headers proved about a provider's clock: it is ahead of ours by more
// than lo and less than hi (known false: nothing).
type clockOffset struct {
	known  bool
	lo, hi time.Duration
	at     time.Time // the last response that narrowed it (our clock)
}

// clockOffsets is each credential's clockOffset, by tag. Safe for concurrent use.
type clockOffsets struct {
	mu    sync.Mutex
	byTag map[string]clockOffset
}

// observe narrows the offset of tag's provider by what o's Date proves and returns it (known false
// when o has no Date). The provider stamped Date, truncated to the second, between o.SentAt and
// o.At: its clock was then ahead of ours by more than Date-At and less than Date+1s-SentAt. One
// response tells the offset to a second; responses at other phases of the provider's second
// narrow it (kept as the intersection) to about their round trip, tighter than ClockSkew. An
// intersection that comes out empty means a clock stepped: the offset starts over from o, as it
// does once ttl passes without a Date.
func (c *clockOffsets) observe(tag string, o Observation, ttl time.Duration) clockOffset {
	if o.Date.IsZero() {
		return clockOffset{}
	}
	n := clockOffset{known: true, lo: o.Date.Sub(o.At), hi: o.Date.Add(time.Second).Sub(o.SentAt), at: o.At}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.byTag[tag]; ok && o.At.Sub(p.at).Abs() <= ttl {
		if lo, hi := max(p.lo, n.lo), min(p.hi, n.hi); lo < hi {
			n.lo, n.hi = lo, hi
		}
		n.at = later(p.at, o.At)
	}
	c.byTag[tag] = n
	return n
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
