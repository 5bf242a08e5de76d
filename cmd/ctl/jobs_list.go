package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/jobs"
)

func (a *app) jobsListCommand() *cli.Command {
	return &cli.Command{
		Name:  "list",
		Usage: "list jobs, newest first",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "status", Usage: "only this status (queued, running, retrying, succeeded, failed, dead, canceled)"},
			&cli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return cli.Exit("usage: ctl jobs list [--status S] [--limit N] [--json]", exitUsage)
			}
			status := jobs.Status(c.String("status"))
			if status != "" && !status.Valid() {
				return cli.Exit(fmt.Sprintf("--status %q: want queued, running, retrying, succeeded, failed, dead or canceled", status), exitUsage)
			}
			if c.Int("limit") < 1 {
				return cli.Exit("--limit must be at least 1", exitUsage)
			}
			p, err := a.pool(c)
			if err != nil {
				return err
			}
			defer p.Close()
			list, err := jobs.NewStore(p, nil).List(c.Context, jobs.ListParams{Status: status, Limit: c.Int("limit")})
			if err != nil {
				return err
			}
			return printList(a.out, c.Bool("json"), list, "no jobs", "ID\tSTATUS\tCREDENTIAL\tATTEMPTS\tCREATED\tFINISHED",
				func(j *jobs.Job) []string {
					return []string{j.ID, string(j.Status), j.Credential, attemptsText(j),
						j.CreatedAt.Format(time.RFC3339), ts(j.FinishedAt)}
				})
		},
	}
}
