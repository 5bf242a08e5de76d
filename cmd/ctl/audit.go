package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
)

// ctlActor is who the audit log names for an action of ctl: "ctl", with the OS user when known.
func ctlActor() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return "ctl:" + u.Username
	}
	return "ctl"
}

// logAction writes e to the audit log as ctl's (ctlActor), as the console writes its operators'
// actions: ctl's commands that change jobs, tenants or operators call it once the change is made,
// and a refused write fails the command, whose change stays made.
func logAction(ctx context.Context, p *pgxpool.Pool, e audit.Entry) error {
	e.Operator = ctlActor()
	_, err := audit.Log(ctx, p, e)
	return err
}

func (a *app) auditCommand() *cli.Command {
	return &cli.Command{
		Name:  "audit",
		Usage: "list operators' actions (console and ctl), newest first",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "operator", Usage: "only this operator's actions"},
			&cli.StringSliceFlag{Name: "action", Usage: fmt.Sprintf("only these actions (repeat it, or a comma list): %s; "+
				"such a page reads at most %d entries, and says where to go on when they held fewer than --limit",
				strings.Join(audit.Actions(), ", "), audit.PageScanRows)},
			&cli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many"},
			&cli.Int64Flag{Name: "before", Usage: "only the actions older than the one of this id (a page's last id, in --json: the next page)"},
			&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return cli.Exit("usage: ctl audit [--operator NAME] [--action NAME,...] [--limit N] [--before ID] [--json]", exitUsage)
			}
			if c.Int("limit") < 1 {
				return cli.Exit("--limit must be at least 1", exitUsage)
			}
			var before string // the console's page cursor: the id of the last entry shown
			if c.IsSet("before") {
				if c.Int64("before") < 1 {
					return cli.Exit("--before must be an entry's id, at least 1", exitUsage)
				}
				before = strconv.FormatInt(c.Int64("before"), 10)
			}
			actions := c.StringSlice("action")
			for i := range actions {
				actions[i] = strings.TrimSpace(actions[i])
			}
			if err := audit.CheckActions(actions); err != nil {
				return cli.Exit("--action: "+err.Error(), exitUsage)
			}
			p, err := a.pool(c)
			if err != nil {
				return err
			}
			defer p.Close()
			page, err := audit.ListPage(c.Context, p, audit.ListParams{Operator: c.String("operator"), Actions: actions,
				Limit: c.Int("limit"), After: before})
			if err != nil {
				return err
			}
			if page.Next != "" && len(page.Entries) < c.Int("limit") {
				// The read stopped at audit.PageScanRows entries: older ones may match. On the
				// error output, so that --json's stays one document.
				defer fmt.Fprintf(a.errOut, "ctl: no more matching entries in the last %d read; older ones: --before %s\n",
					audit.PageScanRows, page.Next)
			}
			return printList(a.out, c.Bool("json"), page.Entries, "no actions", "AT\tOPERATOR\tACTION\tTARGET\tCOUNT\tDETAIL",
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
