package retrypolicy

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Defaults for Config.
const (
	DefaultBaseDelay        = 500 * time.Millisecond
	DefaultMaxDelay         = 60 * time.Second
	DefaultRetryAfterSpread = 5 * time.Second
	DefaultMaxRetryAfter    = 5 * time.Minute
)

// minRetryAfterSpread is the smallest spread window added to a server hint. Providers send
// Retry-After in whole seconds, so every client told "1" would come back within the same
// second; a window of at least one second undoes that rounding.
const minRetryAfterSpread = time.Second

// Config configures a Policy. The zero value, like a nil *Config, means all defaults.
type Config struct {
	// BaseDelay is the full-jitter ceiling of the first retry; it doubles per attempt.
	// Default 500ms. Must not be negative.
	BaseDelay time.Duration
	// MaxDelay caps the full-jitter ceiling. It does not cap a server's Retry-After (see
	// MaxRetryAfter). Default 60s. Must be ≥ BaseDelay.
	MaxDelay time.Duration
	// MaxRetryAfter caps the wait a server's Retry-After imposes, spread included: a longer hint
	// (a typo, a hostile provider, "Retry-After: 99999999") is waited this long at most. The
	// providers' rate-limit windows are a minute; a job whose deadline comes first is failed at
	// once by its caller, not parked. Default 5m. Must be at least 1s and at most the hour
	// ParseRetryAfter clamps to (MaxRetryAfter, the constant).
	MaxRetryAfter time.Duration
	// RetryAfterSpread caps the random spread added to a server's Retry-After. The spread
	// is U(0, w) with w = min(RetryAfterSpread, max(1s, RetryAfter/5)): at least a second
	// (hints come in whole seconds), a fifth of long waits, never more than this cap.
	// Default 5s. Must not be negative.
	RetryAfterSpread time.Duration
	// Float64 returns a random number in [0, 1); values outside are clamped. It must be
	// safe for concurrent use if the Policy is shared. Default: a mutex-guarded
	// math/rand/v2 PCG source seeded at random.
	Float64 func() float64
}

// withDefaults returns a copy of c with zero fields set to their defaults.
func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	out.BaseDelay = cmp.Or(out.BaseDelay, DefaultBaseDelay)
	out.MaxDelay = cmp.Or(out.MaxDelay, DefaultMaxDelay)
	out.RetryAfterSpread = cmp.Or(out.RetryAfterSpread, DefaultRetryAfterSpread)
	out.MaxRetryAfter = cmp.Or(out.MaxRetryAfter, DefaultMaxRetryAfter)
	if out.Float64 == nil {
		out.Float64 = newLockedRand().Float64
	}
	return out
}

// Validate reports the first invalid field of c after defaults are applied, naming it. A
// nil *Config is valid. Call it on configuration read from a file before New, which panics
// on invalid input.
func (c *Config) Validate() error {
	d := c.withDefaults()
	return d.validate()
}

func (c *Config) validate() error {
	switch {
	case c.BaseDelay < 0:
		return fmt.Errorf("retrypolicy: BaseDelay must not be negative, got %s", c.BaseDelay)
	case c.MaxDelay < c.BaseDelay:
		return fmt.Errorf("retrypolicy: MaxDelay (%s) must not be less than BaseDelay (%s)", c.MaxDelay, c.BaseDelay)
	case c.RetryAfterSpread < 0:
		return fmt.Errorf("retrypolicy: RetryAfterSpread must not be negative, got %s", c.RetryAfterSpread)
	case c.MaxRetryAfter < time.Second || c.MaxRetryAfter > MaxRetryAfter:
		return fmt.Errorf("retrypolicy: MaxRetryAfter must be between 1s and %s, got %s", MaxRetryAfter, c.MaxRetryAfter)
	}
	return nil
}

// Policy computes retry delays. It is immutable after New and safe for concurrent use as
// long as Config.Float64 is.
type Policy struct {
	cfg Config
}

// New returns a Policy for cfg; nil means all defaults. It panics if cfg is invalid
// (see Config.Validate): an invalid policy is a programming error at construction.
func New(cfg *Config) *Policy {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		panic(err)
	}
	return &Policy{cfg: c}
}

// Delay returns how long to wait before the next attempt. attempt counts from 1 and is the
// attempt that just failed; values below 1 are treated as 1.
//
// With a server hint (d.HasRetryAfter) the result is h plus a spread U(0, w), where h is
// d.RetryAfter capped at MaxRetryAfter and w = min(RetryAfterSpread, max(1s, h/5)); MaxDelay
// does not apply, the server knows better. The result never exceeds MaxRetryAfter: a hint
// within w of the cap starts its spread at MaxRetryAfter-w, so it may come back up to w
// before the hint has passed (a shared limiter that the hint pushed back still holds its
// request). Without a usable hint (none, or MalformedRetryAfter) it is full jitter,
// FullJitter(attempt, BaseDelay, MaxDelay, r). The result is never negative, whatever attempt
// is.
func (p *Policy) Delay(attempt int, d Decision) time.Duration {
	r := clampUnit(p.cfg.Float64())
	if d.HasRetryAfter {
		limit := p.cfg.MaxRetryAfter
		ra := min(max(d.RetryAfter, 0), limit)
		w := min(p.cfg.RetryAfterSpread, max(minRetryAfterSpread, ra/5))
		ra = max(min(ra, limit-w), 0)
		return min(ra+time.Duration(r*float64(w)), limit)
	}
	return FullJitter(attempt, p.cfg.BaseDelay, p.cfg.MaxDelay, r)
}

// FullJitter returns r·min(maxDelay, base·2^(attempt-1)): a uniform draw from the full-jitter
// window when r is uniform in [0, 1). attempt below 1 counts as 1, r is clamped to [0, 1),
// a non-positive base or maxDelay yields 0. It is pure and cannot overflow: once
// base·2^(attempt-1) would exceed maxDelay, the window is maxDelay.
func FullJitter(attempt int, base, maxDelay time.Duration, r float64) time.Duration {
	if base <= 0 || maxDelay <= 0 {
		return 0
	}
	attempt = max(attempt, 1)
	ceiling := maxDelay
	if shift := attempt - 1; shift < 63 && base <= maxDelay>>shift {
		ceiling = base << shift
	}
	d := time.Duration(clampUnit(r) * float64(ceiling))
	if d < 0 || d > ceiling { // float rounding near 2^63
		return ceiling
	}
	return d
}

// clampUnit maps r into [0, 1); NaN becomes 0.
func clampUnit(r float64) float64 {
	switch {
	case r > 0 && r < 1:
		return r
	case r >= 1:
		return 1 - 1.0/(1<<53)
	default: // negative or NaN
		return 0
	}
}

// lockedRand is a math/rand/v2 source guarded by a mutex: *rand.Rand is not safe for
// concurrent use and a Policy is shared by every worker goroutine.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand() *lockedRand {
	return &lockedRand{r: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// Float64 returns a number in [0, 1).
func (l *lockedRand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}
