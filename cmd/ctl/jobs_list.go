package main

import (
	"fmt"
	"strings"
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
			tenantFlag(),
			&cli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return cli.Exit("usage: ctl jobs list [--status S] [--tenant T] [--limit N] [--json]", exitUsage)
			}
			status := jobs.Status(c.String("status"))
			if status != "" && !status.Valid() {
				return cli.Exit(fmt.Sprintf("--status %q: want queued, running, retrying, succeeded, failed, dead or canceled", status), exitUsage)
			}
			if c.Int("limit") < 1 {
				return cli.Exit("--limit must be at least 1", exitUsage)
			}
			tenant, err := tenantFilter(c)
			if err != nil {
				return err
			}
			p, err := a.pool(c)
			if err != nil {
				return err
			}
			defer p.Close()
			list, err := jobs.NewStore(p, nil).List(c.Context, jobs.ListParams{Status: status, Tenant: tenant,
				Limit: c.Int("limit")})
			if err != nil {
				return err
			}
			return printList(a.out, c.Bool("json"), listed(list), "no jobs", "ID\tSTATUS\tTENANT\tCREDENTIAL\tATTEMPTS\tCREATED\tFINISHED",
				func(j listedJob) []string {
					return []string{j.ID, string(j.Status), j.Tenant, j.Credential, attemptsText(j.Job),
						j.CreatedAt.Format(time.RFC3339), ts(j.FinishedAt)}
				})
		},
	}
}

// tenantFlag is --tenant of the job lists: only the jobs of this tenant. A name no job has lists
// none, as the console's filter.
func tenantFlag() *cli.StringFlag {
	return &cli.StringFlag{Name: "tenant", Usage: "only this tenant's jobs"}
}

// tenantFilter is the value of --tenant ("" when absent: every tenant's jobs). An empty one is a
// usage error: --tenant "$T" with T unset would list every tenant's jobs as if they were T's.
func tenantFilter(c *cli.Context) (string, error) {
	v := c.String("tenant")
	if c.IsSet("tenant") && strings.TrimSpace(v) == "" {
		return "", cli.Exit("--tenant: name a tenant (omit the flag for every tenant's jobs)", exitUsage)
	}
	return v, nil
}

// listedJob is a job as `ctl jobs list --json` and `ctl dead list --json` print it: the API's
// job JSON with its tenant, which the API's leaves out (a tenant sees its own jobs only), as the
// console's lists have it.
type listedJob struct {
	*jobs.Job
	Tenant string `json:"tenant"`
}

// listed are the rows of a job list.
func listed(list []*jobs.Job) []listedJob {
	out := make([]listedJob, 0, len(list))
	for _, j := range list {
		out = append(out, listedJob{Job: j, Tenant: j.Tenant})
	}
	return out
}
