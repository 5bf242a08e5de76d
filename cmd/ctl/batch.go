package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/batchlane"
)

func (a *app) batchCommand() *cli.Command {
	return &cli.Command{
		Name:  "batch",
		Usage: "inspect the batch lane's files at the provider and retry their deletes",
		Subcommands: []*cli.Command{{
			Name: "files",
			Usage: "list the files the batch lane keeps at OpenAI and has not deleted yet (given-up ones first, then the newest; " +
				"NEXT TRY now: the leader's next pass, once its batch is closed); 'retry' puts them back in line",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "given-up", Usage: "only the files whose deletes ran out of attempts (left at the provider)"},
				&cli.StringFlag{Name: "credential", Usage: "only this credential's files"},
				&cli.IntFlag{Name: "limit", Value: 50, Usage: "at most this many"},
				&cli.BoolFlag{Name: "json", Usage: "print JSON"},
			},
			Action: a.batchFiles,
			Subcommands: []*cli.Command{{
				Name: "retry",
				Usage: "put given-up files (--all) or the named ones back in line for their delete: no attempts, due at once; " +
					"the batch lane's leader deletes them in its next pass",
				ArgsUsage: "FILE_ID... | --all",
				Flags: []cli.Flag{
					&cli.BoolFlag{Name: "all", Usage: "every given-up file"},
					&cli.StringFlag{Name: "credential", Usage: "only this credential's files"},
				},
				Action: a.batchFilesRetry,
			}},
		}},
	}
}

func (a *app) batchFiles(c *cli.Context) error {
	if c.NArg() != 0 {
		return cli.Exit("usage: ctl batch files [--given-up] [--credential C] [--limit N] [--json] | ctl batch files retry ...", exitUsage)
	}
	if c.Int("limit") < 1 {
		return cli.Exit("--limit must be at least 1", exitUsage)
	}
	p, err := a.pool(c)
	if err != nil {
		return err
	}
	defer p.Close()
	list, err := batchlane.ListFiles(c.Context, p, batchlane.FilesFilter{
		Credential: c.String("credential"), GivenUp: c.Bool("given-up"), Limit: c.Int("limit")})
	if err != nil {
		return err
	}
	none := "no batch files left to delete"
	if c.Bool("given-up") {
		none = "no given-up batch files"
	}
	return printList(a.out, c.Bool("json"), list, none,
		"CREDENTIAL\tFILE\tBATCH\tKIND\tATTEMPTS\tNEXT TRY\tLAST ERROR",
		func(f batchlane.File) []string {
			attempts, next := strconv.Itoa(f.Attempts), "now"
			switch {
			case f.GivenUp:
				attempts, next = attempts+" (given up)", "-"
			case f.NextTry != nil:
				next = f.NextTry.UTC().Format(time.RFC3339)
			}
			lastError := "-"
			if f.LastError != nil {
				lastError = printable(oneLineText(*f.LastError, 60)) // the provider's text
			}
			return []string{f.Credential, printable(f.ID), f.Batch, f.Kind, attempts, next, lastError}
		})
}

func (a *app) batchFilesRetry(c *cli.Context) error {
	ids, all := c.Args().Slice(), c.Bool("all")
	switch {
	case all && len(ids) > 0:
		return cli.Exit("give file ids or --all, not both", exitUsage)
	case !all && len(ids) == 0:
		return cli.Exit("usage: ctl batch files retry FILE_ID... | --all [--credential C]", exitUsage)
	}
	p, err := a.pool(c)
	if err != nil {
		return err
	}
	defer p.Close()
	credential := c.String("credential")
	reset, err := batchlane.RetryFiles(c.Context, p, batchlane.RetryFilesParams{All: all, IDs: ids, Credential: credential})
	if err != nil {
		return err
	}
	if len(reset) == 0 && all {
		fmt.Fprintln(a.out, "no given-up batch files")
	} else if len(reset) > 0 {
		fmt.Fprintf(a.out, "put %d batch files back in line: the batch lane's leader deletes them in its next pass\n", len(reset))
	}
	var problems []string
	for _, id := range ids {
		if !slices.ContainsFunc(reset, func(f batchlane.File) bool { return f.ID == id }) {
			problem := fmt.Sprintf("no batch file %q", id)
			if credential != "" {
				problem += " of credential " + strconv.Quote(credential)
			}
			problems = append(problems, problem)
		}
	}
	detail := map[string]any{"requested": ids}
	if all {
		detail = map[string]any{"all": true}
	}
	if credential != "" {
		detail["credential"] = credential
	}
	// Written once the change is committed, even when the command was interrupted since.
	if err := logAction(context.WithoutCancel(c.Context), p, audit.Entry{Action: "batch_file.retry", Target: audit.TargetOf(ids),
		Count: len(reset), Detail: detail}); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}
