package dispatch

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrRedisWait is AfterCommit.Run's error when f did not return within RedisWait.
var ErrRedisWait = errors.New("redis did not answer in time (still trying in the background)")

// ErrAfterCommitFull is AfterCommit.Run's error when MaxPending of its functions were still
// running: f was not run at all, and what it would have done is left to the sweeper (an
// enqueue) or the lease (an abort) at once.
var ErrAfterCommitFull = errors.New("too much redis work after commit still pending (left to the sweeper)")

// RedisWait bounds how long an answer waits for Redis once Postgres committed what it says (a
// new job's enqueue, a canceled job's abort, a retried dead letter's requeue): past it the
// answer goes all the same, and Redis's part goes on in the background until the Redis client
// gives up (its timeouts). A stalled Redis (accepting, never answering), whose client retries
// its read timeouts, held a submit's 202 for 40 s (past the server's write timeout: the client,
// cut off without learning of its job, sent it again), a cancel's answer for 20 s, and a
// console's retry of many dead letters for as many times that; the submits' autopipeliner
// waits for a batch's reply whatever a context says.
const RedisWait = time.Second

// DefaultMaxPending is AfterCommitConfig.MaxPending's default. Each pending function is a
// goroutine holding a job id and its Redis command: at 100 submits/s during a Redis stall,
// each living for the Redis client's retries (40 s), they were 4,000, and a stall of minutes
// sent as many commands at once when Redis answered again. In normal operation a few are
// pending (the submit rate × Redis's latency: 10 at 10,000 submits/s and 1 ms).
const DefaultMaxPending = 1000

// AfterCommitConfig configures an AfterCommit. A nil config takes every default.
type AfterCommitConfig struct {
	// Wait is how long Run waits for its function. Default RedisWait.
	Wait time.Duration
	// MaxPending caps the functions that run at once, waited for or left in the background;
	// past it Run refuses at once (ErrAfterCommitFull). Default DefaultMaxPending.
	MaxPending int
	// After returns a channel that receives once d has passed (tests end the wait at once).
	// Default time.After.
	After func(d time.Duration) <-chan time.Time
}

// AfterCommit runs the Redis parts of requests whose Postgres parts are committed (see Run),
// and bounds how many of them run at once, so that a long Redis stall holds no more than
// MaxPending goroutines, and sends no more than that many late commands when Redis answers
// again. It is a prometheus.Collector of llmq_api_after_commit_pending and
// llmq_api_after_commit_refused_total. Safe for concurrent use; one per process, shared by
// everything that commits in Postgres and then tells Redis.
type AfterCommit struct {
	cfg     AfterCommitConfig
	pending atomic.Int64
	refused atomic.Int64

	pendingDesc, refusedDesc *prometheus.Desc
}

// NewAfterCommit returns an AfterCommit; nil or zero config fields take their defaults.
func NewAfterCommit(cfg *AfterCommitConfig) *AfterCommit {
	var c AfterCommitConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Wait <= 0 {
		c.Wait = RedisWait
	}
	if c.MaxPending <= 0 {
		c.MaxPending = DefaultMaxPending
	}
	if c.After == nil {
		c.After = time.After
	}
	return &AfterCommit{cfg: c,
		pendingDesc: prometheus.NewDesc("llmq_api_after_commit_pending",
			"Redis parts of committed requests (enqueues, aborts, requeues) still running, waited for or in the background.", nil, nil),
		refusedDesc: prometheus.NewDesc("llmq_api_after_commit_refused_total",
			"Redis parts of committed requests not run because MaxPending were still running (a Redis stall): left to the sweeper or the lease.", nil, nil),
	}
}

// Run runs f, the Redis part of a request whose Postgres part is committed, and waits for it
// at most Wait. Past it, it returns ErrRedisWait and f goes on in a goroutine of its own: what
// f misses is the sweeper's (an enqueue) or the lease's (an abort), as when Redis is down.
// When MaxPending functions are still running, f is not run and Run returns ErrAfterCommitFull
// at once, leaving what f would have done to them the same way. f must not use a context that
// ends with the request.
func (a *AfterCommit) Run(f func() error) error {
	if a.pending.Add(1) > int64(a.cfg.MaxPending) {
		a.pending.Add(-1)
		a.refused.Add(1)
		return fmt.Errorf("%w: %d pending", ErrAfterCommitFull, a.cfg.MaxPending)
	}
	done := make(chan error, 1)
	go func() {
		defer a.pending.Add(-1)
		done <- f()
	}()
	select {
	case err := <-done:
		return err
	case <-a.cfg.After(a.cfg.Wait):
		return fmt.Errorf("%w: waited %s", ErrRedisWait, a.cfg.Wait)
	}
}

// Pending returns how many functions Run started that have not returned.
func (a *AfterCommit) Pending() int { return int(a.pending.Load()) }

// Refused returns how many functions Run refused (ErrAfterCommitFull).
func (a *AfterCommit) Refused() int64 { return a.refused.Load() }

// Describe implements prometheus.Collector.
func (a *AfterCommit) Describe(ch chan<- *prometheus.Desc) {
	ch <- a.pendingDesc
	ch <- a.refusedDesc
}

// Collect implements prometheus.Collector.
func (a *AfterCommit) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(a.pendingDesc, prometheus.GaugeValue, float64(a.Pending()))
	ch <- prometheus.MustNewConstMetric(a.refusedDesc, prometheus.CounterValue, float64(a.Refused()))
}
