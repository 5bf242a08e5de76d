// Command worker executes llmq jobs: it takes tasks from asynq, calls the provider inside the
// shared limits, and stores the outcome in Postgres. Stateless; run any number. `llmq serve`
// runs one together with the API in one process.
package main

import (
	"context"
	"os"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/process"
	"github.com/llmq/llmq/internal/signals"
)

func main() {
	// go-redis's own lines as the process's JSON lines (process.RedisLog): set once, here.
	redis.SetLogger(process.NewRedisLog(os.Stderr, "worker"))
	ctx, stop := signals.Context(context.Background())
	code := process.ExitCode(os.Stderr, "worker", process.Worker(ctx, os.Args[1:], process.Options{}))
	stop()
	os.Exit(code)
}
