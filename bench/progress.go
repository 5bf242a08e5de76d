package main

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmq/llmq/internal/llmsim"
)

// every calls f with the time since it started every interval, until the returned stop is
// called; stop waits for a call in progress and may be called more than once.
func every(interval time.Duration, f func(elapsed time.Duration)) (stop func()) {
	quit, exited := make(chan struct{}), make(chan struct{})
	began := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-t.C:
				f(time.Since(began))
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { close(quit) }); <-exited }
}

// progress counts a row's jobs that reached their final outcome and reports them every few
// seconds, so that a long row does not look hung. record is safe for concurrent use.
type progress struct {
	done, ok atomic.Int64
}

// record counts one job that reached its final outcome.
func (p *progress) record(ok bool) {
	p.done.Add(1)
	if ok {
		p.ok.Add(1)
	}
}

// report logs the row's progress and the simulator's counters every 2 s until stop.
func (p *progress) report(log logf, name string, n int, stats func() llmsim.Stats) (stop func()) {
	return every(2*time.Second, func(d time.Duration) {
		st := stats()
		log("  %s: %4.0fs: %d/%d done (%d ok); provider: %d requests, %d 429s",
			name, d.Seconds(), p.done.Load(), n, p.ok.Load(), st.Requests, st.ByStatus[429])
	})
}
