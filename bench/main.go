// Command bench runs llmq's benchmark scenarios and prints their tables.
//
//	go run . herd [flags]     # N jobs at once against a rate-limited provider
//	go run . outage [flags]   # N jobs at once while the provider is overloaded
//	go run . tokens [flags]   # N long prompts at once against token limits
//
// Scenarios drive the whole system (the api and worker binaries, Postgres, Redis and an
// in-process llmsim) and may write their table into docs/benchmarks.md. They are benchmark
// figures, not timed tests.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal the rows clean up (child processes, database, Redis keys); a second
	// signal takes the default action and ends the process at once.
	go func() { <-ctx.Done(); stop() }()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

const usage = `usage: bench <scenario> [flags]

scenarios:
  herd   N jobs fired at once against a token bucket: plain retrying clients, plain asynq
         and llmq (limit configured, limit learned) in one table ("bench herd -h" for flags)
  outage N jobs fired at once while the provider answers 529 for a while, then recovers: plain
         asynq, a Retry-After client and llmq with its circuit breaker ("bench outage -h")
  tokens N jobs of long prompts fired at once against input- and output-token limits: llmq
         counting requests only, with token limits known, and with token limits learned
         ("bench tokens -h")
`

// run dispatches to a scenario.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no scenario given")
	}
	switch args[0] {
	case "herd":
		return runHerd(ctx, args[1:], stdout, stderr)
	case "outage":
		return runOutage(ctx, args[1:], stdout, stderr)
	case "throughput":
		return runThroughput(ctx, args[1:], stdout, stderr)
	case "tokens":
		return runTokens(ctx, args[1:], stdout, stderr)
	case "chaos":
		return runChaos(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown scenario %q", args[0])
}
