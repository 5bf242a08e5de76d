package limiter

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The provider's clock offset is what the responses' Dates prove, intersected: each bounds it to
// a second (and the round trip), responses at other phases of the provider's second narrow it,
// and one outside it (a clock stepped), or one after the TTL, starts it over.
func TestClockOffsets_Observe(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	const ttl = 10 * time.Minute
	// resp is a response sent at ours and answered 20 ms later, the provider's clock ahead by
	// ahead, its Date truncated to the second.
	resp := func(ours time.Time, ahead time.Duration) Observation {
		return Observation{SentAt: ours, At: ours.Add(20 * time.Millisecond), Date: ours.Add(ahead).Truncate(time.Second)}
	}
	c := &clockOffsets{byTag: map[string]clockOffset{}}
	require.False(t, c.observe("a", Observation{At: t0}, ttl).known, "no Date")

	const ahead = 400 * time.Millisecond
	// At 12:00:00.700 ours the provider read 12:00:01.1: Date 12:00:01.
	o := c.observe("a", resp(t0.Add(700*time.Millisecond), ahead), ttl)
	require.True(t, o.known)
	require.Equal(t, 280*time.Millisecond, o.lo)  // 01 - 00.720
	require.Equal(t, 1300*time.Millisecond, o.hi) // 02 - 00.700
	// At 12:00:01.550 it read 12:00:01.950: Date 12:00:01, which bounds it from above.
	o = c.observe("a", resp(t0.Add(1550*time.Millisecond), ahead), ttl)
	require.Equal(t, 280*time.Millisecond, o.lo)
	require.Equal(t, 450*time.Millisecond, o.hi) // 02 - 01.550
	// Each credential has its own.
	require.Equal(t, -20*time.Millisecond, c.observe("b", resp(t0, 0), ttl).lo)
	require.Equal(t, 450*time.Millisecond, c.byTag["a"].hi)

	// Our clock steps 2 s ahead: the next Date proves less than lo, and starts over.
	o = c.observe("a", resp(t0.Add(5*time.Second), ahead-2*time.Second), ttl)
	require.Equal(t, -2020*time.Millisecond, o.lo) // 03 - 05.020
	require.Equal(t, -1000*time.Millisecond, o.hi) // 04 - 05

	// Without a Date for the TTL, it starts over too.
	o = c.observe("a", resp(t0.Add(5*time.Second+ttl+time.Second), 0), ttl)
	require.Equal(t, -20*time.Millisecond, o.lo)
	require.Equal(t, time.Second, o.hi)
}
