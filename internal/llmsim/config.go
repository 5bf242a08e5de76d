package llmsim

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"
)

// Config configures a [Server]. The zero value is valid: unlimited, no
// latency, no faults, real clock, fixed-seed randomness, no logging.
type Config struct {
	// Capacity is the size of each API key's token bucket, in requests.
	// A bucket starts full. 0 (the default) means unlimited: no bucket and no
	// rate-limit headers. Otherwise it must be at least 1.
	Capacity float64
	// RefillPerSecond is how many tokens per second flow back into a bucket,
	// continuously. Required (> 0) when Capacity > 0.
	RefillPerSecond float64
	// Latency is how long every answer that passed the bucket waits before it
	// is written. Default 0. The wait ends early if the client goes away.
	Latency time.Duration
	// LatencyJitter adds U(0, LatencyJitter) to Latency. Default 0.
	LatencyJitter time.Duration
	// Faults are the faults active at start and restored by Reset.
	Faults Faults
	// Now is the clock used for buckets, the overload window, rate-limit
	// headers and "created" timestamps. Default time.Now. Waits (latency,
	// slow first byte) use real timers regardless.
	Now func() time.Time
	// Rand returns a float64 in [0, 1); it draws latency jitter and the
	// ErrorRate coin. It is always called with the server's lock held, so it
	// need not be safe for concurrent use. Default: a PCG source with a fixed
	// seed, so runs are reproducible.
	Rand func() float64
	// Logger receives one debug line per answer (endpoint, key id, status,
	// duration). It never receives API keys or prompts. Default: discard.
	Logger *slog.Logger
}

// Validate reports the first invalid field of c, naming it, or nil.
func (c Config) Validate() error {
	switch {
	case c.Capacity < 0:
		return errors.New("capacity: must not be negative")
	case c.Capacity > 0 && c.Capacity < 1:
		return errors.New("capacity: must be 0 (unlimited) or at least 1")
	case c.RefillPerSecond < 0:
		return errors.New("refill_per_second: must not be negative")
	case c.Capacity > 0 && c.RefillPerSecond == 0:
		return errors.New("refill_per_second: required when capacity is set")
	case c.Latency < 0:
		return errors.New("latency: must not be negative")
	case c.LatencyJitter < 0:
		return errors.New("latency_jitter: must not be negative")
	}
	if err := c.Faults.validate(); err != nil {
		return fmt.Errorf("faults: %w", err)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(0x6c6c6d73, 0x696d)).Float64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
