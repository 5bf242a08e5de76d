// Command api serves llmq's HTTP API: submit and poll jobs. It is stateless; run any number.
// `llmq serve` runs it together with a worker in one process.
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
	if err := process.API(ctx, os.Args[1:], process.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}
