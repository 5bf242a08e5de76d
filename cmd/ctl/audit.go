package main

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
)

func (a *app) auditCommand() *cli.Command {
	return &cli.Command{
		Name:  "audit",
		Usage: "list operators' actions (console and ctl), newest first",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "operator", Usage: "only this operator's actions"},
			&cli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return cli.Exit("usage: ctl audit [--operator NAME] [--limit N] [--json]", exitUsage)
			}
			if c.Int("limit") < 1 {
				return cli.Exit("--limit must be at least 1", exitUsage)
			}
			p, err := pool(c)
			if err != nil {
				return err
			}
			defer p.Close()
			list, err := audit.List(c.Context, p, audit.ListParams{Operator: c.String("operator"), Limit: c.Int("limit")})
			if err != nil {
				return err
			}
			if c.Bool("json") {
				if list == nil {
					list = []audit.Entry{}
				}
				return writeJSON(a.out, list)
			}
			if len(list) == 0 {
				_, err := fmt.Fprintln(a.out, "no actions")
				return err
			}
			tw := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AT\tOPERATOR\tACTION\tTARGET\tCOUNT\tDETAIL")
			for _, e := range list {
				target, detail := e.Target, "-"
				if target == "" {
					target = "-"
				}
				if e.Detail != nil {
					b, _ := json.Marshal(e.Detail)
					detail = oneLineText(string(b), 60)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", e.At.Format(time.RFC3339), e.Operator, e.Action, target, e.Count, detail)
			}
			return tw.Flush()
		},
	}
}
