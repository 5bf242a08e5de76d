package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

const asynqTaskType = "bench:herd"

// runAsynq is the plain-asynq row: what a user would build instead of llmq. n tasks are
// enqueued at once on a fresh queue, and an asynq server with its default configuration (only
// the queue and Concurrency = n are set) runs a handler that calls the simulator once and
// returns an error on any non-2xx answer, so asynq's default retry policy decides the rest. It
// stops when every task succeeded or at the timeout; the queue's keys are removed at the end.
func runAsynq(ctx context.Context, e *rowEnv) ([]outcome, error) {
	opt, err := asynq.ParseRedisURI(e.redisURL)
	if err != nil {
		return nil, fmt.Errorf("parse -redis-url: %w", err)
	}
	rdb, ok := opt.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return nil, errors.New("asynq returned an unexpected redis client type")
	}
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis at %s: %w", e.redisURL, err)
	}
	queue := "bench-asynq-" + randHex(8)
	defer cleanQueue(rdb, queue)

	c := newSimClient(e.simURL, e.apiKey, e.n)
	defer c.close()
	var (
		mu        sync.Mutex
		outs      = make([]outcome, e.n)
		submitted = make([]time.Duration, e.n)
		start     time.Time
		left      = e.n
		allDone   = make(chan struct{})
	)
	handler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		i, err := strconv.Atoi(string(t.Payload()))
		if err != nil || i < 0 || i >= e.n {
			return fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
		}
		res := c.call(ctx, i)
		if res.err != nil {
			return res.err
		}
		if res.status/100 != 2 {
			return fmt.Errorf("provider answered %d", res.status)
		}
		mu.Lock()
		defer mu.Unlock()
		at := time.Since(start)
		if outs[i].done {
			return nil // a duplicate delivery
		}
		outs[i] = outcome{done: true, ok: true, latency: at - submitted[i], at: at}
		e.progress.record(true)
		if left--; left == 0 {
			close(allDone)
		}
		return nil
	})
	srv := asynq.NewServer(opt, asynq.Config{
		Concurrency: e.n,
		Queues:      map[string]int{queue: 1},
		LogLevel:    asynq.WarnLevel, // its per-start info lines would drown the progress output
	})
	if err := srv.Start(handler); err != nil {
		return nil, fmt.Errorf("start asynq server: %w", err)
	}
	defer srv.Shutdown()

	client := asynq.NewClient(opt)
	defer client.Close()
	fire := make(chan struct{})
	errs := make(chan error, e.n)
	var wg sync.WaitGroup
	for i := range e.n {
		wg.Go(func() {
			<-fire
			mu.Lock()
			submitted[i] = time.Since(start)
			mu.Unlock()
			if _, err := client.EnqueueContext(ctx, asynq.NewTask(asynqTaskType, []byte(strconv.Itoa(i))), asynq.Queue(queue)); err != nil {
				errs <- fmt.Errorf("enqueue task %d: %w", i, err)
			}
		})
	}
	e.started()
	mu.Lock()
	start = time.Now()
	mu.Unlock()
	close(fire)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}

	timer := time.NewTimer(e.timeout)
	defer timer.Stop()
	select {
	case <-allDone:
	case <-timer.C:
	case <-ctx.Done():
		return nil, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	srv.Shutdown()
	mu.Lock()
	defer mu.Unlock()
	return append([]outcome(nil), outs...), nil
}

// cleanQueue removes every key of an asynq queue and its entry in asynq's queue set, without
// touching anything else in the shared Redis. It runs after the caller's context may have
// ended, so it has its own deadline.
func cleanQueue(rdb redis.UniversalClient, queue string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	unlinkMatching(ctx, rdb, "asynq:{"+queue+"}:*")
	rdb.SRem(ctx, "asynq:queues", queue)
}

// unlinkMatching removes the keys matching pattern, using SCAN so Redis is never blocked.
func unlinkMatching(ctx context.Context, rdb redis.UniversalClient, pattern string) {
	iter := rdb.Scan(ctx, 0, pattern, 500).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			rdb.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		rdb.Unlink(ctx, batch...)
	}
}
