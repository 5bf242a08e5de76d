package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// seconds renders a duration as "8.03 s".
func seconds(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

// msText renders a latency: "4.2 ms", "153 ms", "12.31 s".
func msText(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms < 100:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 10000:
		return fmt.Sprintf("%.0f ms", ms)
	}
	return seconds(d)
}

// thousands renders n with commas: 40000 → "40,000".
func thousands(n int) string {
	s := fmt.Sprint(n)
	digits := strings.TrimPrefix(s, "-")
	var b strings.Builder
	if len(digits) < len(s) {
		b.WriteByte('-')
	}
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// percentile returns the nearest-rank p-th percentile (0 < p ≤ 100) of ds, or 0 for none. ds
// is not modified.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// median is the middle of vs (the mean of the two middle ones for an even count); 0 for none.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(vs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// floorOf is the least time n requests take against a full bucket: capacity at once, the
// rest at the refill rate. Zero when the bucket holds them all.
func floorOf(n int, capacity, rate float64) time.Duration {
	if float64(n) <= capacity || rate <= 0 {
		return 0
	}
	return time.Duration((float64(n) - capacity) / rate * float64(time.Second))
}

// randHex returns 2n random hex digits, for unique names.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}
