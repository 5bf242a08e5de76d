package main

import (
	"encoding/json"
	"strconv"
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
			return printList(a.out, c.Bool("json"), list, "no actions", "AT\tOPERATOR\tACTION\tTARGET\tCOUNT\tDETAIL",
				func(e audit.Entry) []string {
					target, detail := e.Target, "-"
					if target == "" {
						target = "-"
					}
					if e.Detail != nil {
						b, _ := json.Marshal(e.Detail)
						detail = oneLineText(string(b), 60)
					}
					return []string{e.At.Format(time.RFC3339), e.Operator, e.Action, target, strconv.Itoa(e.Count), detail}
				})
		},
	}
}
