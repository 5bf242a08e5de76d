// Package signals gives a command its shutdown context: the first SIGINT or SIGTERM asks the
// process to stop gracefully, a second one ends it at once.
package signals

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Context returns a copy of parent that is canceled by the first SIGINT or SIGTERM. Before it
// is canceled, the signals get their default action back, so a second one ends a shutdown that
// hangs (a call that will not return, a store that does not answer) instead of being swallowed
// as signal.NotifyContext swallows it. (A signal the process was started ignoring, as a shell
// starts background jobs ignoring SIGINT, is ignored again.) stop cancels the context and gives
// the signals back their default action.
func Context(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case <-ch:
			signal.Stop(ch)
			cancel()
		case <-ctx.Done():
			signal.Stop(ch)
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel()
	}
}
