package llmsim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFormatOpenAIDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                                       "0s",
		120 * time.Millisecond:                  "120ms",
		time.Second:                             "1s",
		1500 * time.Millisecond:                 "1.5s",
		6 * time.Minute:                         "6m0s",
		333333333 * time.Nanosecond:             "334ms", // rounded up: never early
		2*time.Second + time.Nanosecond:         "2.001s",
		time.Hour + 2*time.Minute + time.Second: "1h2m1s",
	} {
		require.Equal(t, want, formatOpenAIDuration(d), "%d", d)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                             "1",
		time.Nanosecond:               "1",
		100 * time.Millisecond:        "1",
		time.Second:                   "1",
		time.Second + time.Nanosecond: "2",
		2500 * time.Millisecond:       "3",
		90 * time.Second:              "90",
	} {
		require.Equal(t, want, retryAfterSeconds(d), "%d", d)
	}
}

func TestBucket_TakeIsExact(t *testing.T) {
	t.Parallel()
	// Given capacity 3 refilling at 7/s (an interval that is not a whole ms)
	p := newBucketParams(3, 7)
	var b bucket
	now := time.Unix(1000, 0)
	for i := range 3 {
		ok, st := b.take(p, now)
		require.True(t, ok)
		require.Equal(t, int64(2-i), st.remaining)
	}
	ok, st := b.take(p, now)
	require.False(t, ok)
	require.Equal(t, p.interval, st.retryAfter)
	// Just before a token is back it is still refused; at the instant it is taken
	ok, _ = b.take(p, now.Add(p.interval-1))
	require.False(t, ok)
	ok, st = b.take(p, now.Add(p.interval))
	require.True(t, ok)
	require.Equal(t, 3*p.interval, st.untilFull)
	require.Equal(t, st, b.peek(p, now.Add(p.interval)))
}
