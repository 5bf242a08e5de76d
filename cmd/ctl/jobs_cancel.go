package main

import (
	"errors"
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
)

func (a *app) jobsCancelCommand() *cli.Command {
	return &cli.Command{
		Name:      "cancel",
		Usage:     "cancel a job that has not ended, aborting its provider call if one is in flight, or a dead one, which no retry then sends (as DELETE /v1/jobs/{id}); one already canceled exits 0, its task aborted again",
		ArgsUsage: "ID",
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return cli.Exit("usage: ctl jobs cancel ID", exitUsage)
			}
			id := c.Args().First()
			// The cancel is Postgres's: Redis unreachable does not stop it (as the API's does
			// not), only the abort of the job's task, which is then the error.
			tasks, closeTasks, redisErr := a.openTasks(c)
			switch {
			case errors.Is(redisErr, errRedisUnreachable):
			case redisErr != nil:
				return redisErr
			default:
				defer closeTasks()
			}
			p, err := a.pool(c)
			if err != nil {
				return err
			}
			defer p.Close()
			job, err := jobs.NewStore(p, nil).Cancel(c.Context, id)
			var te *jobs.TerminalError
			var logged error
			switch {
			case jobs.AlreadyCanceled(err) && errors.As(err, &te):
				// Done before (a run whose answer was lost, say): a script sending it again
				// learns that the job is canceled, as the API's DELETE answers 200, and its task
				// is aborted again (not audited again): that run's abort may not have been made.
				fmt.Fprintf(a.out, "%s was already canceled\n", id)
				job = te.Job
			case errors.Is(err, jobs.ErrNotFound):
				return fmt.Errorf("no job %q", id)
			case errors.As(err, &te):
				return fmt.Errorf("job %s already ended: it is %s", id, te.Status)
			case err != nil:
				return err
			default:
				fmt.Fprintf(a.out, "canceled %s\n", job.ID)
				logged = logAction(c.Context, p, audit.Entry{Action: "job.cancel", Target: job.ID, Count: 1})
			}
			if redisErr == nil {
				redisErr = tasks.AbortEnded(c.Context, job)
			}
			if redisErr != nil {
				return fmt.Errorf("job %s is canceled, but its task could not be aborted (an attempt in flight stops, unstored, at its lease's next renewal, within seconds): %w", job.ID, redisErr)
			}
			return logged
		},
	}
}
