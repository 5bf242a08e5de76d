package llmsim

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTokenBucket_IsExact(t *testing.T) {
	t.Parallel()
	// Given 7 tokens per second: a token every 142,857,142.857... ns
	p, err := newTokenParams(7, time.Second)
	require.NoError(t, err)
	require.Equal(t, tokenParams{capacity: 7, unit: 1e9, rate: 7, full: 7e9}, p)
	now := time.Unix(1000, 0)
	b := tokenBucket{at: now}

	// When it is emptied in one go and refilled 7,000 times 1/7000 s apart
	b.add(p, 7)
	require.Equal(t, tokenState{limit: 7, remaining: 0, untilFull: time.Second}, b.state(p))
	step := time.Second / 7000 // 142,857 ns: not a whole share of a token
	for range 7000 {
		now = now.Add(step)
		b.advance(p, now)
	}
	// Then no rounding accumulated: 7000*142857 ns refilled exactly
	require.Equal(t, int64(7e9-7000*142857*7), b.debt)
	require.Equal(t, int64(6), b.state(p).remaining)
	require.Equal(t, time.Duration(ceilDiv(b.debt, 7)), b.wait(p, 7))

	// And a refund never fills it beyond full
	b.add(p, -100)
	require.Equal(t, tokenState{limit: 7, remaining: 7}, b.state(p))
	require.Zero(t, b.wait(p, 7))
	require.Equal(t, time.Duration(ceilDiv(1e9, 7)), b.wait(p, 8))

	// And an overdraft reports 0 remaining, and a clock going back refills nothing
	b.add(p, 10)
	require.Equal(t, int64(0), b.state(p).remaining)
	require.Equal(t, 10*time.Second/7+1, b.state(p).untilFull)
	b.advance(p, now.Add(-time.Hour))
	require.Equal(t, int64(10e9), b.debt)
	b.advance(p, now.Add(time.Hour))
	require.Zero(t, b.debt)
}

func TestTokenParams_Reduced(t *testing.T) {
	t.Parallel()
	// 40,000 per minute: 1.5 ms per token, one unit per ns
	p, err := newTokenParams(40000, time.Minute)
	require.NoError(t, err)
	require.Equal(t, tokenParams{capacity: 40000, unit: 1_500_000, rate: 1, full: 6e10}, p)
	// Huge but round limits fit; co-prime ones that cannot be exact are refused
	_, err = newTokenParams(150_000_000, time.Minute)
	require.NoError(t, err)
	_, err = newTokenParams(1_000_000_007, time.Minute)
	require.ErrorIs(t, err, errTokenBucketTooLarge)
	_, err = newTokenParams(math.MaxInt64/2, time.Nanosecond)
	require.ErrorIs(t, err, errTokenBucketTooLarge)
}

func TestPadReply(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 5, 30, 200} {
		for _, text := range []string{"", "llmsim reply to: ééé", "llmsim reply to: 日本語のテキスト"} {
			got := padReply(text, n)
			require.Len(t, got, 4*n, "%q %d", text, n)
			require.Equal(t, n, tokens(len(got)))
			require.Equal(t, got, padReply(text, n), "deterministic")
		}
	}
}
