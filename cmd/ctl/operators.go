package main

import (
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/operator"
)

func (a *app) operatorsCommand() *cli.Command {
	return &cli.Command{
		Name:  "operators",
		Usage: "manage the console's operators (/console/) and their tokens",
		Subcommands: []*cli.Command{{
			Name:      "create",
			Usage:     "create an operator and print its token (shown once: only its SHA-256 is stored)",
			ArgsUsage: "NAME",
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return cli.Exit("usage: ctl operators create NAME", exitUsage)
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				o, token, err := operator.NewStore(p, nil).Create(c.Context, c.Args().First())
				if err != nil {
					return err
				}
				// The token alone on the output (TOKEN=$(ctl operators create NAME)), and before
				// the audit entry: the operator exists now, and its token nowhere else.
				fmt.Fprintf(a.errOut, "operator %s created; its console token follows and is not shown again:\n", o.Name)
				fmt.Fprintln(a.out, token)
				return logAction(c.Context, p, audit.Entry{Action: "operator.create", Target: o.Name, Count: 1})
			},
		}, {
			Name:      "revoke",
			Usage:     "revoke an operator: its token is refused and its console sessions end at once",
			ArgsUsage: "NAME",
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return cli.Exit("usage: ctl operators revoke NAME", exitUsage)
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				name := c.Args().First()
				was, err := operator.NewStore(p, nil).Revoke(c.Context, name)
				if err != nil {
					return err
				}
				if !was {
					fmt.Fprintf(a.out, "operator %s was revoked already\n", name)
					return nil
				}
				if err := logAction(c.Context, p, audit.Entry{Action: "operator.revoke", Target: name, Count: 1}); err != nil {
					return err
				}
				fmt.Fprintf(a.out, "operator %s revoked\n", name)
				return nil
			},
		}, {
			Name:  "list",
			Usage: "every operator and whether it is revoked (tokens are not stored, so never shown)",
			Flags: []cli.Flag{&cli.BoolFlag{Name: "json", Usage: "print JSON"}},
			Action: func(c *cli.Context) error {
				if c.NArg() != 0 {
					return cli.Exit("usage: ctl operators list [--json]", exitUsage)
				}
				p, err := a.pool(c)
				if err != nil {
					return err
				}
				defer p.Close()
				list, err := operator.NewStore(p, nil).List(c.Context)
				if err != nil {
					return err
				}
				return printList(a.out, c.Bool("json"), list, "no operators (ctl operators create NAME)", "NAME\tCREATED\tREVOKED", func(o operator.Operator) []string {
					return []string{o.Name, o.CreatedAt.Format(time.RFC3339), ts(o.RevokedAt)}
				})
			},
		}},
	}
}
