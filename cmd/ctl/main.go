// Command ctl is llmq's operator CLI.
package main

import (
	"context"
	"os"

	"github.com/llmq/llmq/internal/signals"
	"github.com/redis/go-redis/v9"
)

func main() {
	// go-redis logs each failed dial to stderr; ctl reports an unreachable Redis itself, on one
	// line. The logger is process-wide, so only the binary (not the in-process tests) sets it.
	redis.SetLogger(quietRedis{})
	ctx, stop := signals.Context(context.Background())
	code := newApp(os.Stdout, os.Stderr).run(ctx, os.Args)
	stop()
	os.Exit(code)
}

// quietRedis discards go-redis's internal log lines.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}
