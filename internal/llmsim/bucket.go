package llmsim

import "time"

// bucket is one API key's token bucket, kept as the time at which it will be
// full again (GCRA). Integer nanoseconds keep the arithmetic exact: with
// capacity 20 and 10 tokens/s, 20 requests leave it 2 s from full, and 100 ms
// later exactly one token is back. Not safe for concurrent use; the server's
// lock guards it.
type bucket struct {
	fullAt time.Time
}

// bucketParams are derived once from the configuration.
type bucketParams struct {
	capacity float64
	interval time.Duration // time to refill one token
	window   time.Duration // time to refill the whole bucket
}

func newBucketParams(capacity, perSecond float64) bucketParams {
	interval := max(time.Duration(float64(time.Second)/perSecond), 1)
	return bucketParams{
		capacity: capacity,
		interval: interval,
		window:   time.Duration(capacity * float64(interval)),
	}
}

// bucketState is what the rate-limit headers report.
type bucketState struct {
	limit      float64
	remaining  int64         // whole tokens left
	untilFull  time.Duration // time until the bucket is full again
	retryAfter time.Duration // time until one token, set only on refusal
}

// take charges one token at now if there is one. It reports whether it did,
// and the state after the attempt; a refused attempt changes nothing.
func (b *bucket) take(p bucketParams, now time.Time) (bool, bucketState) {
	debt := max(b.fullAt.Sub(now), 0)
	if need := debt + p.interval; need > p.window {
		st := p.state(debt)
		st.retryAfter = need - p.window
		return false, st
	}
	debt += p.interval
	b.fullAt = now.Add(debt)
	return true, p.state(debt)
}

// peek reports the state at now without charging.
func (b *bucket) peek(p bucketParams, now time.Time) bucketState {
	return p.state(max(b.fullAt.Sub(now), 0))
}

func (p bucketParams) state(debt time.Duration) bucketState {
	return bucketState{
		limit:     p.capacity,
		remaining: int64((p.window - debt) / p.interval),
		untilFull: debt,
	}
}
