package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// chaosFault is one injected fault, its times since the run's start.
type chaosFault struct {
	what  string
	start time.Duration
	end   time.Duration // when the fault was over (the worker restarted, Postgres reachable)
	err   error         // the fault could not be injected
}

// chaosAction is a fault's step due at a time from the start.
type chaosAction struct {
	at time.Duration
	do func()
}

// inject injects the faults at their times and returns them, in the order they started,
// once the last is over.
func (c *chaos) inject(ctx context.Context, sys *chaosSystem, start time.Time, log logf) []chaosFault {
	var mu sync.Mutex
	var faults []chaosFault
	since := func() time.Duration { return time.Since(start) }
	record := func(f chaosFault) int {
		mu.Lock()
		defer mu.Unlock()
		faults = append(faults, f)
		if f.err != nil {
			log("%s: %s: error: %v", seconds(f.start), f.what, f.err)
		} else {
			log("%s: %s", seconds(f.start), f.what)
		}
		return len(faults) - 1
	}
	var actions []chaosAction
	victims := rand.New(rand.NewPCG(c.s.seed, 0x6b696c6c))
	for at := c.killEvery; c.killFor > 0 && at <= c.killFor; at += c.killEvery {
		w := sys.workers[victims.IntN(len(sys.workers))]
		actions = append(actions, chaosAction{at, func() {
			f := chaosFault{what: "SIGKILL " + w.name, start: since()}
			restarted, err := w.kill(ctx)
			f.end, f.err = restarted.Sub(start), err
			if err != nil {
				f.end = since()
			}
			record(f)
		}})
	}
	if c.flushAt > 0 {
		actions = append(actions, chaosAction{c.flushAt, func() {
			f := chaosFault{what: "Redis FLUSHALL", start: since()}
			f.err = sys.rdb.FlushAll(ctx).Err()
			f.end = since()
			record(f)
		}})
	}
	if c.pgDownFor > 0 {
		var i int
		actions = append(actions, chaosAction{c.pgDownAt, func() {
			cut := sys.proxy.setDown(true)
			i = record(chaosFault{what: fmt.Sprintf("Postgres unreachable for %s", c.pgDownFor), start: since()})
			log("  %d connections cut", cut)
		}}, chaosAction{c.pgDownAt + c.pgDownFor, func() {
			sys.proxy.setDown(false)
			mu.Lock()
			faults[i].end = since()
			mu.Unlock()
			log("%s: Postgres reachable again", seconds(since()))
		}})
	}
	slices.SortStableFunc(actions, func(a, b chaosAction) int { return int(a.at - b.at) })
	for _, a := range actions {
		if !sleepUntil(ctx, start.Add(a.at)) {
			sys.proxy.setDown(false)
			break
		}
		a.do()
	}
	mu.Lock()
	defer mu.Unlock()
	slices.SortStableFunc(faults, func(a, b chaosFault) int { return int(a.start - b.start) })
	return faults
}
