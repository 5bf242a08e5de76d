// Command llmq is llmq's server in one binary. `llmq serve` runs the API and a worker in one
// process: a small deployment needs nothing else. `llmq api` and `llmq worker` run them apart
// (the same as the api and worker commands), to scale each out; all of them share one database
// and one Redis. Operators use the ctl command.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/process"
	"github.com/llmq/llmq/internal/signals"
)

const usage = `usage: llmq <command> [flags]

commands:
  serve   the API and a worker in one process (--config, --listen)
  api     the API alone (--config, --listen)
  worker  a worker alone (--config, --metrics-listen)

Run "llmq <command> -h" for a command's flags.
`

func main() {
	// go-redis's own lines as the process's JSON lines (process.RedisLog): set once, here.
	if len(os.Args) > 1 && slices.Contains([]string{"serve", "api", "worker"}, os.Args[1]) {
		redis.SetLogger(process.NewRedisLog(os.Stderr, os.Args[1]))
	}
	ctx, stop := signals.Context(context.Background())
	code := process.ExitCode(os.Stderr, "llmq", run(ctx, os.Args[1:], process.Options{}))
	stop()
	os.Exit(code)
}

// run runs the command args name.
func run(ctx context.Context, args []string, o process.Options) error {
	var stderr io.Writer = os.Stderr
	if o.Stderr != nil {
		stderr = o.Stderr
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return &process.UsageError{Err: errors.New("no command given (want serve, api or worker)")}
	}
	switch args[0] {
	case "serve":
		return process.Serve(ctx, args[1:], o)
	case "api":
		return process.API(ctx, args[1:], o)
	case "worker":
		return process.Worker(ctx, args[1:], o)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stderr, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return &process.UsageError{Err: fmt.Errorf("unknown command %q (want serve, api or worker)", args[0])}
}
