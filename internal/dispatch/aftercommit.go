package dispatch

import (
	"errors"
	"fmt"
	"time"
)

// ErrRedisWait is AfterCommit's error when f did not return within RedisWait.
var ErrRedisWait = errors.New("redis did not answer in time (still trying in the background)")

// RedisWait bounds how long an answer waits for Redis once Postgres committed what it says (a
// new job's enqueue, a canceled job's abort, a retried dead letter's requeue): past it the
// answer goes all the same, and Redis's part goes on in the background until the Redis client
// gives up (its timeouts). A stalled Redis (accepting, never answering), whose client retries
// its read timeouts, held a submit's 202 for 40 s (past the server's write timeout: the client,
// cut off without learning of its job, sent it again), a cancel's answer for 20 s, and a
// console's retry of many dead letters for as many times that; the submits' autopipeliner
// waits for a batch's reply whatever a context says.
const RedisWait = time.Second

// AfterCommit runs f, the Redis part of a request whose Postgres part is committed, and waits
// for it at most RedisWait. Past it, it returns ErrRedisWait and f goes on in a goroutine of its
// own: what f misses is the sweeper's (an enqueue) or the lease's (an abort), as when Redis is
// down. f must not use a context that ends with the request.
func AfterCommit(f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	t := time.NewTimer(RedisWait)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("%w: waited %s", ErrRedisWait, RedisWait)
	}
}
