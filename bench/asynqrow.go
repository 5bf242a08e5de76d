package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
)

const asynqTaskType = "bench:job"

// runAsynq is the plain-asynq row: what a user would build instead of llmq. n tasks are
// enqueued at once on a fresh queue, and an asynq server with its default configuration (only
// the queue and Concurrency = n are set) runs a handler that calls the simulator once and
// returns an error on any non-2xx answer, so asynq's default retry policy decides the rest. It
// stops when every task succeeded or at the timeout; the queue's keys are removed at the end.
func runAsynq(ctx context.Context, e *rowEnv) ([]outcome, error) {
	opt, rdb, err := redisFor(ctx, e.redisURL)
	if err != nil {
		return nil, err
	}
	defer rdb.Close()
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
	handler := simHandler(func(ctx context.Context, t *asynq.Task) (callResult, error) {
		i, err := strconv.Atoi(string(t.Payload()))
		if err != nil || i < 0 || i >= e.n {
			return callResult{}, fmt.Errorf("bad payload %q: %w", t.Payload(), asynq.SkipRetry)
		}
		return c.call(ctx, i), nil
	}, func(t *asynq.Task) {
		i, _ := strconv.Atoi(string(t.Payload()))
		mu.Lock()
		defer mu.Unlock()
		at := time.Since(start)
		if outs[i].done {
			return // a duplicate delivery
		}
		outs[i] = outcome{done: true, ok: true, latency: at - submitted[i], at: at}
		e.progress.record(true)
		if left--; left == 0 {
			close(allDone)
		}
	})
	srv := newAsynqServer(opt, map[string]int{queue: 1}, e.n)
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

// newAsynqServer is an asynq server with its default configuration but for queues (name →
// weight, asynq's weighted priority) and concurrency (0: asynq's default, the number of CPUs).
func newAsynqServer(opt asynq.RedisConnOpt, queues map[string]int, concurrency int) *asynq.Server {
	return asynq.NewServer(opt, asynq.Config{
		Concurrency: concurrency,
		Queues:      queues,
		LogLevel:    asynq.WarnLevel, // its per-start info lines would drown the progress output
	})
}

// simHandler is the plain-asynq handler: call the provider once for the task (call's error ends
// the task as it says) and return an error on a transport error or any non-2xx answer, so that
// asynq's default retry policy decides the rest; ok is called after each 2xx answer.
func simHandler(call func(context.Context, *asynq.Task) (callResult, error), ok func(*asynq.Task)) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		res, err := call(ctx, t)
		switch {
		case err != nil:
			return err
		case res.err != nil:
			return res.err
		case res.status/100 != 2:
			return fmt.Errorf("provider answered %d", res.status)
		}
		ok(t)
		return nil
	})
}
