package llmsim

import (
	"errors"
	"math"
	"time"
)

// tokenParams are the constants of one token bucket: capacity tokens per
// window, refilling continuously.
//
// The bucket's level is kept as a debt in integer units chosen so that both
// a token and a nanosecond of refill are whole numbers of units: with
// g = gcd(capacity, window in ns), one token is window/g units and one
// nanosecond refills capacity/g units. All arithmetic is then exact int64:
// no float, no rounding drift, however many charges and refunds.
type tokenParams struct {
	capacity int64 // tokens the bucket holds when full
	unit     int64 // debt units per token
	rate     int64 // debt units refilled per nanosecond
	full     int64 // capacity * unit: the debt of an empty bucket
}

// maxTokenDebt bounds capacity*unit, leaving room to add one more bucketful
// (a charge never exceeds the capacity) without overflow.
const maxTokenDebt = math.MaxInt64 / 4

// errTokenBucketTooLarge is returned when capacity × window cannot be
// represented exactly.
var errTokenBucketTooLarge = errors.New("too large to count exactly with this token_minute " +
	"(capacity × token_minute in ns, divided by their gcd, must stay below 2^61)")

func newTokenParams(capacity int64, window time.Duration) (tokenParams, error) {
	w := int64(window)
	g := gcd(capacity, w)
	p := tokenParams{capacity: capacity, unit: w / g, rate: capacity / g}
	if p.unit > maxTokenDebt/capacity {
		return tokenParams{}, errTokenBucketTooLarge
	}
	p.full = capacity * p.unit
	return p, nil
}

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// tokenBucket is one key's bucket for one kind of token. The zero value is
// full. Not safe for concurrent use; the server's lock guards it.
type tokenBucket struct {
	debt int64     // units missing from a full bucket; may exceed full (overdrawn)
	at   time.Time // when debt was last brought up to date
}

// tokenState is what the token rate-limit headers report.
type tokenState struct {
	limit     int64         // capacity
	remaining int64         // whole tokens available now, never negative
	untilFull time.Duration // time until the bucket is full again
}

// advance refills the bucket for the time since the last update. A clock
// that goes backwards refills nothing.
func (b *tokenBucket) advance(p tokenParams, now time.Time) {
	if !now.After(b.at) {
		return
	}
	elapsed := int64(now.Sub(b.at))
	b.at = now
	if elapsed >= ceilDiv(b.debt, p.rate) {
		b.debt = 0
		return
	}
	b.debt -= elapsed * p.rate // elapsed*rate < debt: no overflow
}

// wait is how long until n tokens are available, 0 if they are now. Call
// advance first.
func (b *tokenBucket) wait(p tokenParams, n int64) time.Duration {
	need := satAdd(b.debt, n*p.unit) - p.full
	if need <= 0 {
		return 0
	}
	return time.Duration(ceilDiv(need, p.rate))
}

// add charges n tokens (a refund when negative). A charge may overdraw the
// bucket; a refund never fills it beyond full. Call advance first.
func (b *tokenBucket) add(p tokenParams, n int64) {
	if n >= 0 {
		b.debt = satAdd(b.debt, satMul(n, p.unit))
		return
	}
	b.debt = max(b.debt-satMul(-n, p.unit), 0)
}

// state reports the bucket. Call advance first.
func (b *tokenBucket) state(p tokenParams) tokenState {
	st := tokenState{limit: p.capacity, untilFull: time.Duration(ceilDiv(b.debt, p.rate))}
	if b.debt < p.full {
		st.remaining = (p.full - b.debt) / p.unit
	}
	return st
}

// ceilDiv is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 {
		q++
	}
	return q
}

// satAdd is a+b for a, b ≥ 0, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// satMul is a*b for a, b ≥ 0, saturating at math.MaxInt64.
func satMul(a, b int64) int64 {
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
