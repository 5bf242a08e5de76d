package main

import (
	"context"
	"fmt"

	"github.com/hibiken/asynq"
)

// fairAsynqWeights are the plain-asynq comparison's queues: one per priority, with asynq's
// weighted priority (a queue's share of the picks while it has tasks).
var fairAsynqWeights = map[string]int{"high": 6, "normal": 3, "low": 1}

// asynqSystem is what a Go team would build instead: -workers asynq servers with their default
// configuration (concurrency = the number of CPUs) on three weighted queues, one per priority,
// whose handler calls the simulator once through the same limiter-less client as the herd's
// plain rows and lets asynq's default retry decide after a 429 (simHandler, as the herd's and
// the outage's "asynq, default retry" rows). asynq has no tenants: the weights are ignored and
// A's and B's tasks of one priority share a queue. Its queues' keys are removed at the end.
func (f *fairness) asynqSystem() fairSystem {
	return fairSystem{name: "asynq 6:3:1", start: func(ctx context.Context, log logf, simURL string, _ map[string]int) (sendFunc, func(), error) {
		opt, rdb, err := redisFor(ctx, f.s.redisURL)
		if err != nil {
			return nil, nil, err
		}
		prefix := "bench-fair-" + randHex(8) + "-"
		queues := map[string]int{}
		for prio, w := range fairAsynqWeights {
			queues[prefix+prio] = w
		}
		c := newSimClient(simURL, "sk-bench-"+randHex(8), 64)
		client := asynq.NewClient(opt)
		var servers []*asynq.Server
		stop := func() {
			for _, srv := range servers {
				srv.Shutdown()
			}
			client.Close()
			c.close()
			for q := range queues {
				cleanQueue(rdb, q)
			}
			rdb.Close()
		}
		handler := simHandler(func(ctx context.Context, t *asynq.Task) (callResult, error) {
			return c.send(ctx, t.Payload()), nil
		}, func(*asynq.Task) {})
		for range f.s.workers {
			srv := newAsynqServer(opt, queues, 0)
			if err := srv.Start(handler); err != nil {
				stop()
				return nil, nil, fmt.Errorf("start asynq server: %w", err)
			}
			servers = append(servers, srv)
		}
		log("%d asynq servers ready", f.s.workers)
		send := func(ctx context.Context, _, prio string, _ int, body []byte) error {
			_, err := client.EnqueueContext(ctx, asynq.NewTask(asynqTaskType, body), asynq.Queue(prefix+prio))
			return err
		}
		return send, stop, nil
	}}
}
