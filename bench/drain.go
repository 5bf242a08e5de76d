package main

import (
	"context"
	"time"
)

// drainSampler samples a drain every second: the CPU of the workers, of the database's
// backends and of Redis, and the workers' stage histograms, for the CPU per job as the backlog
// shrinks.
type drainSampler struct {
	sys     *llmqSystem
	pg0     backendCPU    // the backends' CPU before the drain; nil: not measured
	redis0  time.Duration // Redis's CPU before the drain
	samples []backlogSample
}

// newDrainSampler reads the baseline; call it before the workers start. It always returns a
// sampler; the error says what will not be measured.
func newDrainSampler(ctx context.Context, sys *llmqSystem) (*drainSampler, error) {
	d := &drainSampler{sys: sys, samples: []backlogSample{{stages: map[string]stageTotal{}}}}
	if sys.rdb != nil {
		d.redis0, _ = redisCPU(ctx, sys.rdb)
	}
	var err error
	d.pg0, err = postgresBackends(ctx, sys.o.dbURL, sys.d.dbName)
	return d, err
}

// sample records the state when done jobs had completed.
func (d *drainSampler) sample(ctx context.Context, done int) {
	s := backlogSample{done: done}
	if d.sys.rdb != nil {
		if c, err := redisCPU(ctx, d.sys.rdb); err == nil {
			s.redis = c - d.redis0
		}
	}
	for _, p := range d.sys.st.workers {
		if c, err := procCPU(p.pid()); err == nil {
			s.workers += c
		}
	}
	if d.pg0 != nil {
		if b, err := postgresBackends(ctx, d.sys.o.dbURL, d.sys.d.dbName); err == nil {
			s.postgres = b.since(d.pg0)
		}
	}
	if t, ok := d.sys.stageTotals(ctx); ok {
		s.stages = t
	}
	d.samples = append(d.samples, s)
}

// backlogSample is the drain's state at one moment, for the CPU per job as the backlog shrinks.
type backlogSample struct {
	done     int
	workers  time.Duration         // CPU of the worker processes since they started
	postgres time.Duration         // CPU of the database's backends since the drain started
	redis    time.Duration         // CPU of the Redis server (shared) since the drain started
	stages   map[string]stageTotal // the workers' stage histograms since they started (nil: not read)
}

// backlogSlice is one tenth of the drain.
type backlogSlice struct {
	from, to   int     // jobs [from, to) in finishing order
	rate       float64 // jobs/s over the slice
	workersMS  float64 // worker CPU ms per job over the slice; <0: not measured
	postgresMS float64 // postgres CPU ms per job over the slice; <0: not measured
	redisMS    float64 // Redis server CPU ms per job over the slice; <0: not measured
	// stages are the deliveries' mean time per stage over the slice (nil: not read)
	stages []stageTime
}

// rateBetween is the rate of results i+1..j given their finishing times ts (sorted): (j − i) over
// ts[j] − ts[i]; 0 when the span is empty.
func rateBetween(ts []time.Time, i, j int) float64 {
	if i < 0 || j >= len(ts) || j <= i {
		return 0
	}
	d := ts[j].Sub(ts[i])
	if d <= 0 {
		return 0
	}
	return float64(j-i) / d.Seconds()
}

// cpuAt returns the CPU sample at the first moment at least done jobs had completed (the last
// sample when none reached it).
func cpuAt(samples []backlogSample, done int) backlogSample {
	for _, s := range samples {
		if s.done >= done {
			return s
		}
	}
	if len(samples) == 0 {
		return backlogSample{}
	}
	return samples[len(samples)-1]
}

// drainSlices cuts the finishing times ts into k slices with their rate and, from samples, the
// CPU per job.
func drainSlices(ts []time.Time, samples []backlogSample, k int) []backlogSlice {
	n := len(ts)
	if n < 2 || k < 1 {
		return nil
	}
	out := make([]backlogSlice, 0, k)
	for s := range k {
		from, to := s*n/k, min((s+1)*n/k, n-1)
		sl := backlogSlice{from: from, to: to, rate: rateBetween(ts, from, to), workersMS: -1, postgresMS: -1, redisMS: -1}
		a, b := cpuAt(samples, from), cpuAt(samples, to)
		if jobs := b.done - a.done; jobs > 0 {
			per := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(jobs) }
			sl.workersMS, sl.postgresMS, sl.redisMS = per(b.workers-a.workers), per(b.postgres-a.postgres), per(b.redis-a.redis)
			if a.stages != nil && b.stages != nil {
				sl.stages = stageTimes(a.stages, b.stages)
			}
		}
		out = append(out, sl)
	}
	return out
}
