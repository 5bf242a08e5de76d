// Package logstreak logs a run of failures of something retried on a timer once, not once per
// try: while Postgres or Redis is unreachable every process's leadership tries, passes and
// refreshes fail every interval, and a line per process per interval would bury the rest of the
// log.
package logstreak

import (
	"context"
	"log/slog"
)

// New returns a report, told each outcome of what from one goroutine at a time, that logs on
// logger the first error of a run of them ("what failed; further errors are not logged until it
// succeeds", at warning) and the success that ends the run ("what succeeds again", at info, with
// the run's number of failures: failures=N). Nothing is logged once ctx has ended: a shutdown's
// errors are not failures.
func New(ctx context.Context, logger *slog.Logger, what string) func(error) {
	failures := 0 // in the current run; 0: none
	return func(err error) {
		switch {
		case ctx.Err() != nil:
		case err != nil:
			if failures == 0 {
				logger.WarnContext(ctx, what+" failed; further errors are not logged until it succeeds", "error", err)
			}
			failures++
		case failures > 0:
			logger.InfoContext(ctx, what+" succeeds again", "failures", failures)
			failures = 0
		}
	}
}
