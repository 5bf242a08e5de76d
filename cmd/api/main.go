// Command api serves llmq's HTTP API: submit and poll jobs. It is stateless; run any number.
// `llmq serve` runs it together with a worker in one process.
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
	redis.SetLogger(process.NewRedisLog(os.Stderr, "api"))
	ctx, stop := signals.Context(context.Background())
	code := process.ExitCode(os.Stderr, "api", process.API(ctx, os.Args[1:], process.Options{}))
	stop()
	os.Exit(code)
}
