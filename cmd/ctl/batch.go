package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/batchlane"
)

func (a *app) batchCommand() *cli.Command {
	return &cli.Command{
		Name:  "batch",
		Usage: "inspect the batch lane's files at the provider, retry their deletes or forget them",
		Subcommands: []*cli.Command{{
			Name: "files",
			Usage: "list the files the batch lane keeps at OpenAI and has not deleted yet (given-up ones first, then the newest; " +
				"NEXT TRY now: the leader's next pass, once its batch is closed); 'retry' puts them back in line, 'forget' removes their rows",
			Flags: []cli.Flag{
				&cli.BoolFlag{Name: "given-up", Usage: "only the files whose deletes ran out of attempts (left at the provider)"},
				filesCredentialFlag(),
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
					filesCredentialFlag(),
				},
				Action: a.batchFilesRetry,
			}, {
				Name: "forget",
				Usage: "remove the rows of the named files (given up or not) without deleting them at the provider: " +
					"for files deleted there by hand; the batch lane's leader no longer deletes them " +
					"(an input file still there, of a batch it still has, is recorded again by its hourly listing)",
				ArgsUsage: "FILE_ID...",
				Flags: []cli.Flag{
					filesCredentialFlag(),
				},
				Action: a.batchFilesForget,
			}},
		}},
	}
}

// filesCredentialFlag is --credential of the batch files commands.
func filesCredentialFlag() cli.Flag {
	return &cli.StringFlag{Name: "credential", Usage: "only this credential's files"}
}

func (a *app) batchFiles(c *cli.Context) error {
	if c.NArg() != 0 {
		return cli.Exit("usage: ctl batch files [--given-up] [--credential C] [--limit N] [--json] | ctl batch files retry|forget ...", exitUsage)
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
	a.warnUnconfigured(c, list)
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
	return a.changeBatchFiles(c, fileChange{ids: ids, all: all, action: "batch_file.retry", warn: true,
		done: func(n int) string {
			if n == 1 {
				return "put 1 batch file back in line: the batch lane's leader deletes it in its next pass"
			}
			return fmt.Sprintf("put %d batch files back in line: the batch lane's leader deletes them in its next pass", n)
		},
		change: func(ctx context.Context, p *pgxpool.Pool, credential string) ([]batchlane.File, error) {
			return batchlane.RetryFiles(ctx, p, batchlane.RetryFilesParams{All: all, IDs: ids, Credential: credential})
		}})
}

func (a *app) batchFilesForget(c *cli.Context) error {
	ids := c.Args().Slice()
	if len(ids) == 0 {
		return cli.Exit("usage: ctl batch files forget FILE_ID... [--credential C]", exitUsage)
	}
	return a.changeBatchFiles(c, fileChange{ids: ids, action: "batch_file.forget",
		done: func(n int) string {
			if n == 1 {
				return "forgot 1 batch file: its row is removed, the file left as it is at the provider"
			}
			return fmt.Sprintf("forgot %d batch files: their rows are removed, the files left as they are at the provider", n)
		},
		change: func(ctx context.Context, p *pgxpool.Pool, credential string) ([]batchlane.File, error) {
			return batchlane.ForgetFiles(ctx, p, credential, ids)
		}})
}

// fileChange is a change of batch files' rows `ctl batch files retry` or `forget` makes.
type fileChange struct {
	// ids are the files named (none with all: every given-up file).
	ids []string
	all bool
	// action is the audit entry's action; done says what was done to n files.
	action string
	done   func(n int) string
	// warn warns of the changed files of credentials not configured (see warnUnconfigured):
	// retried, they are still nobody's to delete.
	warn bool
	// change makes the change to the files of credential ("": any credential's) and returns
	// those it changed.
	change func(ctx context.Context, p *pgxpool.Pool, credential string) ([]batchlane.File, error)
}

// changeBatchFiles makes ch: it says how many files it changed, warns of those of credentials
// not configured (see warnUnconfigured), names the ids it did not find (then fails, exit 1) and
// writes one audit entry. An empty id is a usage error.
func (a *app) changeBatchFiles(c *cli.Context, ch fileChange) error {
	if slices.Contains(ch.ids, "") {
		return cli.Exit("an empty file id: name each file by its id (`ctl batch files` lists them)", exitUsage)
	}
	p, err := a.pool(c)
	if err != nil {
		return err
	}
	defer p.Close()
	credential := c.String("credential")
	changed, err := ch.change(c.Context, p, credential)
	if err != nil {
		return err
	}
	if len(changed) == 0 && ch.all {
		fmt.Fprintln(a.out, "no given-up batch files")
	} else if len(changed) > 0 {
		fmt.Fprintln(a.out, ch.done(len(changed)))
	}
	if ch.warn {
		a.warnUnconfigured(c, changed)
	}
	var problems []string
	for _, id := range ch.ids {
		if !slices.ContainsFunc(changed, func(f batchlane.File) bool { return f.ID == id }) {
			problem := fmt.Sprintf("no batch file %q", id)
			if credential != "" {
				problem += " of credential " + strconv.Quote(credential)
			}
			problems = append(problems, problem)
		}
	}
	detail := map[string]any{"requested": ch.ids}
	if ch.all {
		detail = map[string]any{"all": true}
	}
	if credential != "" {
		detail["credential"] = credential
	}
	// Written once the change is committed, even when the command was interrupted since.
	if err := logAction(context.WithoutCancel(c.Context), p, audit.Entry{Action: ch.action, Target: audit.TargetOf(ch.ids),
		Count: len(changed), Detail: detail}); err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}

// warnUnconfigured warns on the error output when files belong to credentials the config file
// (--config) does not have: the leader deletes the files of its own config's credentials only,
// so no worker deletes these (retried or not) until the credential is configured again. Without
// --config the workers' credentials are unknown here, and a config that does not load says
// nothing either (as retentionNotes).
func (a *app) warnUnconfigured(c *cli.Context, files []batchlane.File) {
	cfg, err := fileConfig(c)
	if err != nil || cfg == nil {
		return
	}
	var unknown []string
	n := 0
	for _, f := range files {
		if _, ok := cfg.Credential(f.Credential); !ok {
			n++
			if !slices.Contains(unknown, f.Credential) {
				unknown = append(unknown, f.Credential)
			}
		}
	}
	if n == 0 {
		return
	}
	slices.Sort(unknown)
	them := plural(n, "it", "them")
	fmt.Fprintf(a.errOut, "ctl: warning: %d of these batch files %s %s not in the config (%s): "+
		"no worker of it deletes %s; delete %s at the provider by hand, then `ctl batch files forget` %s\n",
		n, plural(n, "belongs to", "belong to"), plural(len(unknown), "a credential", "credentials"),
		printable(strings.Join(unknown, ", ")), them, them, them)
}
