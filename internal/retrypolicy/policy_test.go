package retrypolicy_test

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/retrypolicy"
)

func fixed(r float64) func() float64 { return func() float64 { return r } }

func TestFullJitter(t *testing.T) {
	t.Parallel()

	const base, maxDelay = 500 * time.Millisecond, 60 * time.Second
	tests := []struct {
		name          string
		attempt       int
		base, maxWait time.Duration
		r             float64
		want          time.Duration
	}{
		{"Attempt1Half", 1, base, maxDelay, 0.5, 250 * time.Millisecond},
		{"Attempt3Half", 3, base, maxDelay, 0.5, time.Second},
		{"Attempt3Quarter", 3, base, maxDelay, 0.25, 500 * time.Millisecond},
		{"Attempt7Half", 7, base, maxDelay, 0.5, 16 * time.Second},
		{"Attempt8CappedHalf", 8, base, maxDelay, 0.5, 30 * time.Second}, // 64s window capped to 60s
		{"Attempt0CountsAsOne", 0, base, maxDelay, 0.5, 250 * time.Millisecond},
		{"NegativeAttemptCountsAsOne", -7, base, maxDelay, 0.5, 250 * time.Millisecond},
		{"RZero", 5, base, maxDelay, 0, 0},
		{"RNegativeClamped", 5, base, maxDelay, -3, 0},
		{"RNaNClamped", 5, base, maxDelay, math.NaN(), 0},
		{"MaxBelowBase", 1, time.Second, 100 * time.Millisecond, 0.5, 50 * time.Millisecond},
		{"ZeroBase", 3, 0, maxDelay, 0.5, 0},
		{"ZeroMax", 3, base, 0, 0.5, 0},
		{"Attempt62", 62, base, maxDelay, 0.5, 30 * time.Second},
		{"Attempt63", 63, base, maxDelay, 0.5, 30 * time.Second},
		{"Attempt64", 64, base, maxDelay, 0.5, 30 * time.Second},
		{"Attempt1000", 1000, base, maxDelay, 0.5, 30 * time.Second},
		{"AttemptMaxInt", math.MaxInt, base, maxDelay, 0.5, 30 * time.Second},
		{"HugeMaxHugeAttempt", math.MaxInt, 1, math.MaxInt64, 0.5, 1 << 62}, // float64 rounding of 2^63-1
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tt.want, retrypolicy.FullJitter(tt.attempt, tt.base, tt.maxWait, tt.r))
		})
	}

	t.Run("NeverReachesOrExceedsCeiling", func(t *testing.T) {
		t.Parallel()

		r := math.Nextafter(1, 0)
		for attempt := 1; attempt <= 200; attempt++ {
			ceiling := min(maxDelay, base<<min(attempt-1, 20))
			d := retrypolicy.FullJitter(attempt, base, maxDelay, r)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.Less(t, d, ceiling, "attempt %d", attempt)
		}
		require.Less(t, retrypolicy.FullJitter(1, base, maxDelay, 1), base, "r=1 is clamped below 1")
		d := retrypolicy.FullJitter(math.MaxInt, 1, math.MaxInt64, r)
		require.Positive(t, d)
	})
}

func TestPolicy_Delay(t *testing.T) {
	t.Parallel()

	t.Run("FullJitterExact", func(t *testing.T) {
		t.Parallel()

		p := retrypolicy.New(&retrypolicy.Config{Float64: fixed(0.5)})
		d := retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 503}
		require.Equal(t, 250*time.Millisecond, p.Delay(1, d))
		require.Equal(t, 500*time.Millisecond, p.Delay(2, d))
		require.Equal(t, time.Second, p.Delay(3, d))
		require.Equal(t, 30*time.Second, p.Delay(20, d), "capped by MaxDelay 60s")
		require.Equal(t, 30*time.Second, p.Delay(math.MaxInt, d))
	})

	t.Run("CustomBaseAndMax", func(t *testing.T) {
		t.Parallel()

		p := retrypolicy.New(&retrypolicy.Config{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second, Float64: fixed(0.5)})
		d := retrypolicy.Decision{Class: retrypolicy.ClassTimeout, Retry: true}
		require.Equal(t, 200*time.Millisecond, p.Delay(3, d))
		require.Equal(t, 500*time.Millisecond, p.Delay(10, d))
	})

	t.Run("RetryAfterPlusSpreadExact", func(t *testing.T) {
		t.Parallel()

		p := retrypolicy.New(&retrypolicy.Config{Float64: fixed(0.5)})
		tests := []struct {
			ra, want time.Duration
		}{
			{0, 500 * time.Millisecond},                  // window 1s (the floor)
			{2 * time.Second, 2500 * time.Millisecond},   // window 1s (floor beats 20%)
			{10 * time.Second, 11 * time.Second},         // window 2s (20%)
			{60 * time.Second, 62500 * time.Millisecond}, // window capped at 5s
			{4 * time.Minute, 4*time.Minute + 2500*time.Millisecond},
			{5 * time.Minute, 5*time.Minute - 2500*time.Millisecond}, // the cap: spread below it
			{10 * time.Minute, 5*time.Minute - 2500*time.Millisecond},
		}
		for _, tt := range tests {
			d := retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, RetryAfter: tt.ra, HasRetryAfter: true}
			require.Equal(t, tt.want, p.Delay(1, d), "retry-after %s", tt.ra)
			require.Equal(t, tt.want, p.Delay(50, d), "attempt does not matter with a hint")
		}
	})

	t.Run("RetryAfterIgnoresMaxDelay", func(t *testing.T) {
		t.Parallel()

		p := retrypolicy.New(&retrypolicy.Config{MaxDelay: time.Second, Float64: fixed(0)})
		d := retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, RetryAfter: 30 * time.Second, HasRetryAfter: true}
		require.Equal(t, 30*time.Second, p.Delay(1, d))
	})

	t.Run("CustomSpreadCap", func(t *testing.T) {
		t.Parallel()

		p := retrypolicy.New(&retrypolicy.Config{RetryAfterSpread: 100 * time.Millisecond, Float64: fixed(0.5)})
		d := retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, RetryAfter: time.Second, HasRetryAfter: true}
		require.Equal(t, 1050*time.Millisecond, p.Delay(1, d))
	})

	t.Run("RetryAfterSaturates", func(t *testing.T) {
		t.Parallel()

		p := retrypolicy.New(&retrypolicy.Config{Float64: fixed(0.9)})
		d := retrypolicy.Decision{RetryAfter: math.MaxInt64, HasRetryAfter: true}
		require.Equal(t, 5*time.Minute-500*time.Millisecond, p.Delay(1, d), "capped at MaxRetryAfter, spread included")
		d = retrypolicy.Decision{RetryAfter: -time.Second, HasRetryAfter: true}
		require.Equal(t, 900*time.Millisecond, p.Delay(1, d), "a negative hint counts as zero")
	})

	// A hint longer than MaxRetryAfter is waited MaxRetryAfter at most, spread included, whatever
	// the random draw; a shorter one is untouched.
	t.Run("RetryAfterCapped", func(t *testing.T) {
		t.Parallel()

		for _, r := range []float64{0, 0.5, math.Nextafter(1, 0)} {
			p := retrypolicy.New(&retrypolicy.Config{MaxRetryAfter: 30 * time.Second, Float64: fixed(r)})
			for _, ra := range []time.Duration{30 * time.Second, time.Minute, retrypolicy.MaxRetryAfter} {
				got := p.Delay(1, retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, RetryAfter: ra, HasRetryAfter: true})
				require.LessOrEqual(t, got, 30*time.Second, "hint %s, r %v", ra, r)
				require.GreaterOrEqual(t, got, 25*time.Second, "hint %s, r %v: spread within the last 5s", ra, r)
			}
		}
		p := retrypolicy.New(&retrypolicy.Config{MaxRetryAfter: time.Second, Float64: fixed(0.5)})
		require.Equal(t, 500*time.Millisecond, p.Delay(1, retrypolicy.Decision{RetryAfter: time.Hour, HasRetryAfter: true}),
			"a cap below the spread window spreads over the whole cap")
		p = retrypolicy.New(&retrypolicy.Config{MaxRetryAfter: 30 * time.Second, Float64: fixed(0.5)})
		require.Equal(t, 10*time.Second+time.Second, p.Delay(1, retrypolicy.Decision{RetryAfter: 10 * time.Second, HasRetryAfter: true}))
	})

	// A malformed Retry-After is no hint: full jitter, as for a 503.
	t.Run("MalformedRetryAfterIsFullJitter", func(t *testing.T) {
		t.Parallel()

		p := retrypolicy.New(&retrypolicy.Config{Float64: fixed(0.5)})
		d := retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true, StatusCode: 429, MalformedRetryAfter: true, RetryAfterValue: "-5"}
		require.Equal(t, 250*time.Millisecond, p.Delay(1, d))
		require.Equal(t, time.Second, p.Delay(3, d))
	})

	t.Run("RandomOutOfRangeClamped", func(t *testing.T) {
		t.Parallel()

		d := retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true}
		require.Less(t, retrypolicy.New(&retrypolicy.Config{Float64: fixed(7)}).Delay(1, d), 500*time.Millisecond)
		require.Equal(t, time.Duration(0), retrypolicy.New(&retrypolicy.Config{Float64: fixed(-1)}).Delay(1, d))
	})

	t.Run("DefaultSourceBounds", func(t *testing.T) {
		t.Parallel()

		p := retrypolicy.New(nil)
		hint := retrypolicy.Decision{Class: retrypolicy.ClassRateLimited, Retry: true, RetryAfter: 2 * time.Second, HasRetryAfter: true}
		noHint := retrypolicy.Decision{Class: retrypolicy.ClassRetryable, Retry: true}
		var wg sync.WaitGroup
		results := make(chan [2]time.Duration, 800)
		for range 8 {
			wg.Go(func() {
				for range 100 {
					results <- [2]time.Duration{p.Delay(1, hint), p.Delay(4, noHint)}
				}
			})
		}
		wg.Wait()
		close(results)
		distinct := map[time.Duration]bool{}
		for r := range results {
			require.GreaterOrEqual(t, r[0], 2*time.Second)
			require.Less(t, r[0], 3*time.Second)
			require.GreaterOrEqual(t, r[1], time.Duration(0))
			require.Less(t, r[1], 4*time.Second)
			distinct[r[0]] = true
		}
		require.Greater(t, len(distinct), 100, "the spread must actually spread")
	})
}

func TestConfig_Validate(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name    string
		cfg     *retrypolicy.Config
		wantErr string
	}{
		{"Nil", nil, ""},
		{"Zero", &retrypolicy.Config{}, ""},
		{"Custom", &retrypolicy.Config{BaseDelay: time.Second, MaxDelay: time.Second, RetryAfterSpread: time.Millisecond}, ""},
		{"NegativeBase", &retrypolicy.Config{BaseDelay: -time.Second}, "BaseDelay"},
		{"MaxBelowBase", &retrypolicy.Config{BaseDelay: 2 * time.Second, MaxDelay: time.Second}, "MaxDelay"},
		{"BaseAboveDefaultMax", &retrypolicy.Config{BaseDelay: 2 * time.Minute}, "MaxDelay"},
		{"NegativeSpread", &retrypolicy.Config{RetryAfterSpread: -1}, "RetryAfterSpread"},
		{"MaxRetryAfterBelowASecond", &retrypolicy.Config{MaxRetryAfter: time.Millisecond}, "MaxRetryAfter"},
		{"MaxRetryAfterNegative", &retrypolicy.Config{MaxRetryAfter: -time.Second}, "MaxRetryAfter"},
		{"MaxRetryAfterAboveAnHour", &retrypolicy.Config{MaxRetryAfter: 2 * time.Hour}, "MaxRetryAfter"},
		{"MaxRetryAfterAnHour", &retrypolicy.Config{MaxRetryAfter: time.Hour}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			err := tt.cfg.Validate()
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NotNil(t, retrypolicy.New(tt.cfg))
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			require.PanicsWithError(t, err.Error(), func() { retrypolicy.New(tt.cfg) })
		})
	}
}
