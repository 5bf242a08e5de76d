package main

import (
	"context"
	"errors"
	"time"
)

// chaos is `bench chaos`: jobs submitted over a few seconds, through several api processes to
// several workers, while workers are SIGKILLed, Redis is flushed and Postgres is cut off. The
// chaos targets: every submit is accepted, every accepted job ends in time with one stored
// result, no provider call comes after a job's result, and no answer is a 500 or a 503
// without Retry-After.
type chaos struct {
	s           *shared
	apis        int
	maxAttempts int
	submitOver  time.Duration
	latency     time.Duration
	jitter      time.Duration
	killEvery   time.Duration
	killFor     time.Duration
	flushAt     time.Duration
	pgDownAt    time.Duration
	pgDownFor   time.Duration
	grace       time.Duration
	redisServer string
	res         chaosResult
}

func (c *chaos) flags(fs *flagSet, s *shared) {
	c.s = s
	s.base(fs, 3)
	s.jobs(fs, 300, "jobs submitted, spread over -submit-over")
	s.bucket(fs, 10, 10)
	s.seeded(fs)
	fs.intAtLeast(&c.apis, "apis", 2, 1, "api processes (the submits are spread over them)")
	fs.intAtLeast(&c.maxAttempts, "max-attempts", 20, 1, "max_attempts of each job")
	fs.durationAtLeast(&c.submitOver, "submit-over", 15*time.Second, 0, "the submits are spread evenly over this time from the start")
	fs.durationAtLeast(&c.latency, "latency", time.Second, 0, "the simulator's latency per answer")
	fs.durationAtLeast(&c.jitter, "jitter", 2*time.Second, 0, "plus U(0, jitter)")
	fs.DurationVar(&c.killEvery, "kill-every", 2*time.Second, "SIGKILL a random worker this often, and restart it at once")
	fs.durationAtLeast(&c.killFor, "kill-for", 20*time.Second, 0, "for this long from the start (0: no kills)")
	fs.durationAtLeast(&c.flushAt, "flush-at", 7*time.Second, 0, "FLUSHALL the run's private Redis at this time from the start (0: never)")
	fs.durationAtLeast(&c.pgDownAt, "pg-down-at", 11*time.Second, 0, "cut Postgres off at this time from the start")
	fs.durationAtLeast(&c.pgDownFor, "pg-down-for", 5*time.Second, 0, "for this long (0: never)")
	fs.positiveDuration(&c.grace, "grace", time.Minute, "every accepted job must be terminal this long after the last fault ended")
	fs.StringVar(&c.redisServer, "redis-server", "redis-server", "redis-server binary: the run starts a private one (it is flushed)")
	fs.check(func() error {
		if c.killFor > 0 && c.killEvery <= 0 {
			return errors.New("-kill-every: must be positive")
		}
		return nil
	})
}

func (c *chaos) run(ctx context.Context, log logf) error {
	if err := c.s.binaries(ctx, log); err != nil {
		return err
	}
	log("%d jobs over %s to %d apis, %d workers; simulator %g/s burst %g, latency %s + U(0, %s); "+
		"SIGKILL a worker every %s for %s, FLUSHALL at %s, Postgres down at %s for %s",
		c.s.n, c.submitOver, c.apis, c.s.workers, c.s.rate, c.s.capacity, c.latency, c.jitter,
		c.killEvery, c.killFor, c.flushAt, c.pgDownAt, c.pgDownFor)
	sys, err := c.start(ctx, log)
	if err != nil {
		return err
	}
	defer sys.close()
	c.res, err = c.drive(ctx, sys, log)
	sys.keep = c.s.keepLogs || (err != nil && ctx.Err() == nil)
	return err
}
