package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/hibiken/asynq"
	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
)

// statusOrder lists every status, in lifecycle order, for the stats table.
var statusOrder = []jobs.Status{
	jobs.StatusQueued, jobs.StatusRunning, jobs.StatusRetrying,
	jobs.StatusSucceeded, jobs.StatusFailed, jobs.StatusDead, jobs.StatusCanceled,
}

// statsOutput is the JSON form of `ctl stats`.
type statsOutput struct {
	Window string `json:"window"`
	*jobs.Stats
	// Queue is the asynq queue's depth; null when Redis did not answer (the console's overview
	// says the same so).
	Queue *dispatch.QueueDepth `json:"queue"`
}

func (a *app) statsCommand() *cli.Command {
	return &cli.Command{
		Name:  "stats",
		Usage: "jobs submitted and ended in the window, jobs waiting or running now, queue depth, retry rate, requests per success, submit→result latency",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "window", Value: "1h", Usage: "how far back to look (30m, 24h, 7d)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return cli.Exit("usage: ctl stats [--window D] [--json]", exitUsage)
			}
			window, err := parseAge("window", c.String("window"))
			if err != nil {
				return err
			}
			notes := retentionNotes(c, window)
			printNotes := func(err error) error { // after the figures they qualify
				if err == nil {
					for _, n := range notes {
						fmt.Fprintln(a.errOut, "ctl: note: "+n)
					}
				}
				return err
			}
			// The figures are Postgres's: Redis down leaves only the queue's depth unknown (a
			// Redis URL that does not parse still fails the command). The depth is read beside
			// the figures, so that a Redis that never answers costs its wait (a.redisWait) beside
			// Postgres's statements rather than before them.
			opt, queueName, err := redisConn(c)
			if err != nil {
				return err
			}
			queue := make(chan queueRead, 1)
			go func() { queue <- a.readQueue(c.Context, opt, queueName) }()
			var q *queueRead
			awaitQueue := func() queueRead {
				if q == nil {
					r := <-queue
					q = &r
				}
				return *q
			}
			defer awaitQueue() // the read never outlives the command
			p, err := a.pool(c)
			if err != nil {
				return err
			}
			defer p.Close()
			st, err := jobs.NewStore(p, nil).Stats(c.Context, window) // on Postgres's clock
			if err != nil {
				return err
			}
			qr := awaitQueue()
			depth := qr.depth
			if qr.err != nil {
				notes = append(notes, "queue depth unknown: "+qr.err.Error())
			}
			for _, s := range statusOrder {
				st.ByStatus[s] += 0 // every status present, zeros included
			}
			if c.Bool("json") {
				return printNotes(writeJSON(a.out, statsOutput{Window: window.String(), Stats: st, Queue: depth}))
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			row := func(k string, v any) { fmt.Fprintf(tw, "%s\t%v\n", k, v) }
			row("window", window.String())
			row("jobs submitted", st.Submitted)
			for _, s := range statusOrder {
				if s.Terminal() {
					row("jobs "+string(s), st.ByStatus[s]) // ended in the window
				} else {
					row("jobs "+string(s)+" now", st.ByStatus[s]) // whatever their age
				}
			}
			for _, q := range []struct {
				name  string
				count func(*dispatch.QueueDepth) int
			}{
				{"pending", func(d *dispatch.QueueDepth) int { return d.Pending }},
				{"active", func(d *dispatch.QueueDepth) int { return d.Active }},
				{"scheduled", func(d *dispatch.QueueDepth) int { return d.Scheduled }},
				{"retry", func(d *dispatch.QueueDepth) int { return d.Retry }},
				{"archived", func(d *dispatch.QueueDepth) int { return d.Archived }},
			} {
				if depth == nil {
					row("queue "+q.name, "-")
				} else {
					row("queue "+q.name, q.count(depth))
				}
			}
			row("attempts", st.Attempts)
			row("retries", st.Retries)
			row("retry rate", optional(st.RetryRate, func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }))
			row("requests per success", optional(st.RequestsPerSuccess, func(v float64) string { return fmt.Sprintf("%.2f", v) }))
			row("submit→result p50", optional(st.SubmitToResultP50MS, millis))
			row("submit→result p95", optional(st.SubmitToResultP95MS, millis))
			return printNotes(tw.Flush())
		},
	}
}

// queueRead is readQueue's answer: the queue's depth, or why it is unknown.
type queueRead struct {
	depth *dispatch.QueueDepth
	// err wraps errRedisUnreachable: Redis did not answer.
	err error
}

// readQueue connects to the Redis of opt (connectTasks) and reads queue's depth, each step
// bounded by a.redisWait, and closes the connections.
func (a *app) readQueue(ctx context.Context, opt asynq.RedisConnOpt, queue string) queueRead {
	tasks, closeTasks, err := a.connectTasks(ctx, opt, queue)
	if err != nil {
		return queueRead{err: err}
	}
	defer closeTasks()
	d, err := tasks.Depth(ctx)
	if err != nil {
		return queueRead{err: fmt.Errorf("%w: %w", errRedisUnreachable, err)}
	}
	return queueRead{depth: &d}
}

// retentionNotes says, for each final status whose retention period in the config file is
// shorter than window, that the window's count of it is partial: the retention pass deleted the
// jobs that ended before the period. Without a config file the workers' periods are unknown
// here, and one that does not load (its database_url overridden) says nothing either.
func retentionNotes(c *cli.Context, window time.Duration) []string {
	path := c.String("config")
	if path == "" {
		return nil
	}
	cfg, err := config.LoadWithoutSecrets(path, nil)
	if err != nil {
		return nil
	}
	r := cfg.Retention
	var notes []string
	for _, p := range []struct {
		status string
		period config.Period
	}{{"succeeded", r.Succeeded}, {"failed", r.Failed}, {"canceled", r.Canceled}, {"dead", r.Dead}} {
		if d := p.period.Duration(); d > 0 && d < window {
			notes = append(notes, fmt.Sprintf("the window (%s) is longer than retention.%s (%s): "+
				"jobs that ended before it were deleted and are not counted", window, p.status, d))
		}
	}
	return notes
}

func optional(v *float64, format func(float64) string) string {
	if v == nil {
		return "-"
	}
	return format(*v)
}

func millis(ms float64) string {
	return (time.Duration(ms * float64(time.Millisecond))).Round(time.Millisecond).String()
}
