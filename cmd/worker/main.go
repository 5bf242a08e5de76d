// Command worker executes llmq jobs: it takes tasks from asynq, calls the provider inside the
// shared limits, and stores the outcome in Postgres. Stateless; run any number. `llmq serve`
// runs one together with the API in one process.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/llmq/llmq/internal/process"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := process.Worker(ctx, os.Args[1:], process.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
