package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFairness_Defaults(t *testing.T) {
	t.Parallel()
	f, s := parse[*fairness](t, "fairness")
	require.Equal(t, []any{20 * time.Second, 4, 20.0, 10.0, 3 * time.Minute, true}, []any{f.dur, s.workers, s.capacity, s.rate, s.timeout, s.build})
}

// TestFairness_Shares: the share of matching requests per window, min and max, skipping empty
// windows; and the busy rate.
func TestFairness_Shares(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var log []arrival
	for i := range 40 { // 10/s for 4 s: A, B, A, B, ... then only A in the last second
		who := "A"
		if i%2 == 1 && i < 30 {
			who = "B"
		}
		log = append(log, arrival{at: t0.Add(time.Duration(i) * 100 * time.Millisecond), tenant: who})
	}
	lo, hi := shares(log, t0, t0.Add(4*time.Second), time.Second, func(a arrival) bool { return a.tenant == "A" })
	require.InDelta(t, 0.5, lo, 1e-9)
	require.InDelta(t, 1.0, hi, 1e-9)
	lo, hi = shares(log, t0, t0.Add(4*time.Second), 4*time.Second, func(a arrival) bool { return a.tenant == "A" })
	require.InDelta(t, 25.0/40, lo, 1e-9, "one window over the whole span")
	require.InDelta(t, 25.0/40, hi, 1e-9)
	lo, hi = shares(log, t0, t0, 0, func(a arrival) bool { return true })
	require.Greater(t, lo, hi, "no window: no share (and no endless loop)")
	require.InDelta(t, 10.0, busyRate(log, t0.Add(time.Hour), 0), 1e-9)
	require.InDelta(t, 10.0, busyRate(log, t0.Add(2*time.Second), 1), 1e-9)
	// a burst of 20 at once, then 10/s for 2 s: 10/s beyond the burst, not 20.5
	var burst []arrival
	for i := range 40 {
		at := t0
		if i >= 20 {
			at = t0.Add(time.Duration(i-19) * 100 * time.Millisecond)
		}
		burst = append(burst, arrival{at: at})
	}
	require.InDelta(t, 10.0, busyRate(burst, t0.Add(time.Hour), 20), 1e-9)
}

// TestFairness_FirstWaits: each job's wait is to its first served request; a job never served
// waits until now (a lower bound) and is counted missing.
func TestFairness_FirstWaits(t *testing.T) {
	t.Parallel()
	t0 := time.Now().Add(-time.Minute)
	log := []arrival{
		{at: t0.Add(2 * time.Second), tenant: "B", i: 0},
		{at: t0.Add(3 * time.Second), tenant: "A", i: 1}, // another tenant's job 1
		{at: t0.Add(4 * time.Second), tenant: "B", i: 0}, // a duplicate
	}
	waits, missing := firstWaits(log, 2, func(a arrival) bool { return a.tenant == "B" }, func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) })
	require.Equal(t, 1, missing)
	require.Equal(t, 2*time.Second, waits[0])
	require.GreaterOrEqual(t, waits[1], 59*time.Second)
	require.Equal(t, "≥ 2.00 s", waitText(2*time.Second, missing))
	require.Equal(t, "A -", shareText("A", 1, 0, 2))
	require.Equal(t, 1, len(served([]arrival{{status: 200}, {status: 429}})))
}
