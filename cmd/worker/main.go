// Command worker executes llmq jobs: it takes tasks from asynq, calls the provider inside the
// shared limits, and stores the outcome in Postgres. Stateless; run any number. `llmq serve`
// runs one together with the API in one process.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/llmq/llmq/internal/process"
	"github.com/llmq/llmq/internal/signals"
)

func main() {
	ctx, stop := signals.Context(context.Background())
	defer stop()
	if err := process.Worker(ctx, os.Args[1:], process.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
