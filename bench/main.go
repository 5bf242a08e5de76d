// Command bench runs llmq's benchmark scenarios and prints their tables; with -write it
// replaces the scenario's section of docs/benchmarks.md. Run it in bench/:
//
//	go run . herd [flags]
//	go run . <scenario> -h
//
// Scenarios drive the whole system (the api and worker binaries, Postgres, Redis and an
// in-process llmsim); their figures are measurements, not timed tests.
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
	// After the first signal the rows clean up (child processes, databases, Redis keys); a
	// second signal takes the default action and ends the process at once.
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

// run runs the scenario named by args[0] with the flags that follow.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return errors.New("no scenario given")
	}
	if proc, ok := hiddenProcess(args[0]); ok { // the processes of the River over HTTP row, the floor's
		return proc(ctx, args[1:], stderr)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage())
		return nil
	}
	for _, e := range scenarios() {
		if e.name == args[0] {
			return runScenario(ctx, e, args[1:], stdout, stderr)
		}
	}
	fmt.Fprint(stderr, usage())
	return fmt.Errorf("unknown scenario %q", args[0])
}
