// Command ctl is llmq's operator CLI.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := newApp(os.Stdout, os.Stderr).run(ctx, os.Args)
	stop()
	os.Exit(code)
}
