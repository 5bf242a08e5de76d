package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/llm"
)

func (a *app) jobsCommand() *cli.Command {
	return &cli.Command{
		Name:  "jobs",
		Usage: "inspect jobs and cancel one",
		Subcommands: []*cli.Command{{
			Name:      "show",
			Usage:     "show a job and its attempts, with the usage its provider counted (the job's answer's, each attempt's)",
			ArgsUsage: "ID",
			Flags:     []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return cli.Exit("usage: ctl jobs show ID", 2)
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				store := jobs.NewStore(p, nil)
				job, err := store.Get(c.Context, c.Args().First())
				if errors.Is(err, jobs.ErrNotFound) {
					return fmt.Errorf("no job %q", c.Args().First())
				}
				if err != nil {
					return err
				}
				attempts, err := store.Attempts(c.Context, job.ID)
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return writeJSON(a.out, map[string]any{"job": job, "tenant": job.Tenant, "attempts": attempts})
				}
				return printJob(a, job, attempts)
			},
		}},
	}
}

func printJob(a *app, j *jobs.Job, attempts []jobs.AttemptRow) error {
	tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
	row("id", j.ID)
	row("status", j.Status)
	row("tenant", j.Tenant)
	row("credential", j.Credential)
	row("priority", j.Priority)
	row("model", printable(requestModel(j.Request))) // the tenant's text
	row("attempts", fmt.Sprintf("%d/%d", j.Attempts, j.MaxAttempts))
	row("lane", j.Lane)
	if j.BatchState != nil {
		row("batch", fmt.Sprintf("%s (%s)", deref(j.BatchID, "-"), *j.BatchState))
	}
	if j.CostClass != nil {
		row("cost class", *j.CostClass)
	}
	row("created", j.CreatedAt.Format(time.RFC3339))
	if j.FinishedAt != nil {
		row("finished", j.FinishedAt.Format(time.RFC3339))
	}
	if j.DeadReason != nil {
		row("dead reason", *j.DeadReason)
	}
	if j.LastError != nil {
		// The provider's message, which quotes the tenant's text (a model it does not know).
		row("last error", printable(fmt.Sprintf("%s %d: %s", j.LastError.Class, j.LastError.Status, j.LastError.Message)))
	}
	if j.Usage != nil {
		row("usage", usageText(j.Usage))
	}
	row("request bytes", len(j.Request))
	row("result bytes", len(j.Result))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(attempts) == 0 {
		return nil
	}
	fmt.Fprintln(a.out)
	tw = tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT\tSTARTED\tSTATUS\tCLASS\tRETRY-AFTER\tDELAY\tLATENCY\tUSAGE")
	for _, at := range attempts {
		status, ra, delay := "-", "-", "-"
		if at.StatusCode != nil {
			status = fmt.Sprint(*at.StatusCode)
		}
		if at.RetryAfterMS != nil {
			ra = (time.Duration(*at.RetryAfterMS) * time.Millisecond).String()
		}
		if at.DelayMS != nil {
			delay = (time.Duration(*at.DelayMS) * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", at.Number, at.StartedAt.Format(time.RFC3339), status, at.Class, ra, delay,
			(time.Duration(at.LatencyMS * float64(time.Millisecond))).Round(time.Millisecond), usageText(at.Usage))
	}
	return tw.Flush()
}

// deref is *p, or def when p is nil.
func deref(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

// usageText is a stored usage (llm.Usage's JSON) for a table: "120 in, 45 out", with the
// prompt cache's counts when there were some, "120 in, output not reported" when the provider
// gave no output count (output_unreported: its 0 is no count), "input not reported, 45 out" when
// its whole prompt is 0 (no prompt is 0 tokens: the provider gave no input count); "-" for none (NULL or a JSON
// null, or a usage counting nothing: what a worker of the last release stored for an answer
// without a usage, llm.Usage.Reported), and the JSON itself, on one line, when it is not one (a
// row written by something else).
func usageText(raw json.RawMessage) string {
	if raw == nil || string(bytes.TrimSpace(raw)) == "null" {
		return "-"
	}
	var u llm.Usage
	if err := json.Unmarshal(raw, &u); err != nil {
		return printable(oneLineText(string(raw), 80))
	}
	if !u.Reported() {
		return "-"
	}
	in, out := fmt.Sprintf("%d in", u.InputTokens), fmt.Sprintf("%d out", u.OutputTokens)
	if u.PromptInput() == 0 {
		in = "input not reported"
	}
	if u.OutputUnreported {
		out = "output not reported"
	}
	s := in + ", " + out
	if u.CacheCreationInputTokens > 0 {
		s += fmt.Sprintf(", %d cache written", u.CacheCreationInputTokens)
	}
	if u.CacheReadInputTokens > 0 {
		s += fmt.Sprintf(", %d cache read", u.CacheReadInputTokens)
	}
	return s
}
