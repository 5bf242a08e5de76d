package main

import (
	"fmt"
	"text/tabwriter"
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
			p, err := pool(c)
			if err != nil {
				return err
			}
			defer p.Close()
			list, err := jobs.NewStore(p, nil).List(c.Context, jobs.ListParams{Status: status, Limit: c.Int("limit")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if list == nil {
					list = []*jobs.Job{}
				}
				return writeJSON(a.out, list)
			}
			if len(list) == 0 {
				_, err := fmt.Fprintln(a.out, "no jobs")
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATUS\tCREDENTIAL\tATTEMPTS\tCREATED\tFINISHED")
			for _, j := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\n", j.ID, j.Status, j.Credential, j.Attempts, j.MaxAttempts,
					j.CreatedAt.Format(time.RFC3339), ts(j.FinishedAt))
			}
			return tw.Flush()
		},
	}
}
