package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/migrations"
)

// app is the CLI with its output streams injected, so tests run it in-process.
type app struct {
	out, errOut io.Writer
	cli         *cli.App
}

func newApp(out, errOut io.Writer) *app {
	a := &app{out: out, errOut: errOut}
	a.cli = &cli.App{
		Name:      "ctl",
		Usage:     "operate llmq: migrations, jobs",
		Writer:    out,
		ErrWriter: errOut,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "config file", EnvVars: []string{config.EnvConfig}},
			&cli.StringFlag{Name: "database-url", Usage: "Postgres URL (overrides the config file)", EnvVars: []string{config.EnvDatabaseURL}},
		},
		Commands: []*cli.Command{
			a.migrateCommand(),
			a.jobsCommand(),
		},
		// Errors are printed once, by run; never os.Exit inside the library.
		ExitErrHandler: func(*cli.Context, error) {},
	}
	return a
}

// run executes args and returns the exit code: 0 ok, 1 failure, 2 usage.
func (a *app) run(ctx context.Context, args []string) int {
	if err := a.cli.RunContext(ctx, args); err != nil {
		fmt.Fprintln(a.errOut, "ctl:", err)
		if ec, ok := err.(cli.ExitCoder); ok && ec.ExitCode() != 0 {
			return ec.ExitCode()
		}
		return 1
	}
	return 0
}

// databaseURL resolves the Postgres URL: --database-url, else the config file, else the default.
func databaseURL(c *cli.Context) (string, error) {
	if u := c.String("database-url"); u != "" {
		return u, nil
	}
	if p := c.String("config"); p != "" {
		cfg, err := config.Load(p, nil)
		if err != nil {
			return "", err
		}
		return cfg.DatabaseURL, nil
	}
	return config.DefaultDatabaseURL, nil
}

// pool opens a pool on the database, failing fast with a one-line error when unreachable.
func pool(c *cli.Context) (*pgxpool.Pool, error) {
	u, err := databaseURL(c)
	if err != nil {
		return nil, err
	}
	p, err := pgxpool.New(c.Context, u)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	if err := p.Ping(c.Context); err != nil {
		p.Close()
		return nil, fmt.Errorf("postgres unreachable: %w", err)
	}
	return p, nil
}

func (a *app) migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "create the database if needed and apply pending migrations",
		Action: func(c *cli.Context) error {
			u, err := databaseURL(c)
			if err != nil {
				return err
			}
			if err := migrations.EnsureDatabase(c.Context, u); err != nil {
				return err
			}
			p, err := pgxpool.New(c.Context, u)
			if err != nil {
				return fmt.Errorf("open database: %w", err)
			}
			defer p.Close()
			applied, err := migrations.Up(c.Context, p)
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(a.out, "schema is up to date")
				return nil
			}
			for _, v := range applied {
				fmt.Fprintf(a.out, "applied migration %03d\n", v)
			}
			return nil
		},
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
