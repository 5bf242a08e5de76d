package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/urfave/cli/v2"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/tenant"
	"github.com/llmq/llmq/migrations"
)

// app is the CLI with its output streams injected, so tests run it in-process.
type app struct {
	out, errOut io.Writer
	cli         *cli.App
	// revokeSettle is how long after a revocation `tenants revoke --cancel-jobs` looks for the
	// tenant's jobs once more: the API replicas' cache TTL, and a second for a submit they
	// accepted just before it ended to commit its job.
	revokeSettle time.Duration
	// redisWait bounds the wait for Redis: its first ping, and each step of a command on it
	// (see ctlTasks).
	redisWait time.Duration
	// lockReportFirst and lockReportEvery schedule migrate's reports of a wait for the migration
	// lock (zero: migrations' defaults, 1 s and 15 s).
	lockReportFirst, lockReportEvery time.Duration
	// bound bounds the statements of the command's pool (--timeout; wait 0: none) and records
	// what befell them, for run's message (nil: no pool yet, or migrate's).
	bound *statementBound
	// group is the command run's group (jobs, tenants, ...; "" before one runs), for its hints.
	group string
}

func newApp(out, errOut io.Writer) *app {
	a := &app{out: out, errOut: errOut, revokeSettle: tenant.DefaultCacheTTL + time.Second, redisWait: defaultRedisWait}
	jobs := a.jobsCommand()
	jobs.Subcommands = append(jobs.Subcommands, a.jobsListCommand(), a.jobsCancelCommand())
	a.cli = &cli.App{
		Name:      "ctl",
		Usage:     "operate llmq: migrations, jobs, dead letters, batch files, credentials, tenants, operators, stats, audit",
		Writer:    out,
		ErrWriter: errOut,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "config file", EnvVars: []string{config.EnvConfig}},
			&cli.StringFlag{Name: "database-url", Usage: "Postgres URL (overrides the config file)", EnvVars: []string{config.EnvDatabaseURL}},
			&cli.StringFlag{Name: "redis-url", Usage: "Redis URL (overrides the config file)", EnvVars: []string{config.EnvRedisURL}},
			&cli.StringFlag{Name: "queue", Usage: "asynq queue (overrides worker.queue of the config file; default llmq)"},
			&cli.DurationFlag{Name: "timeout", Value: defaultTimeout,
				Usage: "bound on each Postgres statement of a command, and on each wait for a connection (not of migrate), past which the command fails; 0: none"},
			&cli.StringFlag{Name: "redis-prefix", Usage: "prefix of llmq's own Redis keys (limiter, breaker)", Value: "llmq:", Hidden: true},
		},
		Commands: []*cli.Command{
			a.migrateCommand(),
			jobs,
			a.deadCommand(),
			a.batchCommand(),
			a.credentialsCommand(),
			a.tenantsCommand(),
			a.statsCommand(),
			a.operatorsCommand(),
			a.auditCommand(),
		},
		// Errors are printed once, by run; never os.Exit inside the library.
		ExitErrHandler: func(*cli.Context, error) {},
		// A negative --timeout would bound nothing, as 0 does: a typo must not lift the bound.
		Before: func(c *cli.Context) error {
			if d := c.Duration("timeout"); d < 0 {
				return cli.Exit(fmt.Sprintf("--timeout %s: want 0 (none) or a positive duration", d), exitUsage)
			}
			return nil
		},
		// Without a command (or with an unknown one) it is a usage error, not help and exit 0.
		Action:       usageAction(true),
		OnUsageError: onUsageError,
	}
	setUsageErrors(a.cli.Commands)
	for _, cmd := range a.cli.Commands {
		cmd.Before = func(*cli.Context) error { a.group = cmd.Name; return nil }
	}
	return a
}

// exitUsage is the exit code for a command line ctl cannot run.
const exitUsage = 2

// onUsageError makes a flag parsing error a usage error (exit 2), printed once by run.
func onUsageError(_ *cli.Context, err error, _ bool) error {
	return cli.Exit(err.Error(), exitUsage)
}

// usageAction is the action of the app (root) or of a command group: it runs only when no known
// subcommand was given. Without arguments it shows the help on the output; either way it fails
// with a usage error.
func usageAction(root bool) cli.ActionFunc {
	return func(c *cli.Context) error {
		name := c.App.Name
		if !root {
			name = c.Command.HelpName
		}
		if c.Args().Present() {
			return cli.Exit(fmt.Sprintf("unknown command %q; see '%s --help'", c.Args().First(), name), exitUsage)
		}
		if root {
			_ = cli.ShowAppHelp(c)
		} else {
			_ = cli.ShowSubcommandHelp(c)
		}
		return cli.Exit(fmt.Sprintf("no command given; see '%s --help'", name), exitUsage)
	}
}

// setUsageErrors gives every command the usage-error handling of the app.
func setUsageErrors(cmds []*cli.Command) {
	for _, cmd := range cmds {
		cmd.OnUsageError = onUsageError
		if len(cmd.Subcommands) > 0 && cmd.Action == nil {
			cmd.Action = usageAction(false)
		}
		setUsageErrors(cmd.Subcommands)
	}
}

// run executes args and returns the exit code: 0 ok, 1 failure, 2 usage.
func (a *app) run(ctx context.Context, args []string) int {
	if err := a.cli.RunContext(ctx, flagsFirst(a.cli, args)); err != nil {
		fmt.Fprintln(a.errOut, "ctl:", oneLine(err.Error())+schemaHint(err)+a.statementHint())
		if ec, ok := err.(cli.ExitCoder); ok && ec.ExitCode() != 0 {
			return ec.ExitCode()
		}
		if refusedInput(err) {
			return exitUsage
		}
		return 1
	}
	return 0
}

// refusedInput reports whether err is a store's refusal of input the user got wrong: a name's
// form, a weight or overlap out of range, a credential listed twice, a name taken (in any case),
// the anonymous requests' tenant named for deletion, a database URL migrations refuses. ctl
// exits with those as with a command line it refuses (exitUsage): running the command again as
// it is cannot pass. A name that no tenant or operator has (ErrNotFound) stays a failure (exit
// 1), as do Postgres's and Redis's.
func refusedInput(err error) bool {
	for _, target := range []error{tenant.ErrInvalidName, tenant.ErrInvalidWeight, tenant.ErrInvalidOverlap,
		tenant.ErrDuplicateCredential, tenant.ErrExists, tenant.ErrAnonymousTenant,
		operator.ErrInvalidName, operator.ErrExists} {
		if errors.Is(err, target) {
			return true
		}
	}
	_, badURL := errors.AsType[*migrations.URLError](err)
	return badURL
}

// oneLine joins the lines of a multi-line error message (errors.Join, pgx's per-host errors) so
// that every failure prints as one line: by "; ", or by a space after a line that ends in ":",
// which introduces the next (yaml's "unmarshal errors:").
func oneLine(msg string) string {
	var b strings.Builder
	for i, l := range strings.Split(strings.TrimSpace(msg), "\n") {
		if i > 0 {
			if strings.HasSuffix(b.String(), ":") {
				b.WriteString(" ")
			} else {
				b.WriteString("; ")
			}
		}
		b.WriteString(strings.TrimSpace(l))
	}
	return b.String()
}

// schemaHint is what to do about err when Postgres answered that the database, or a table or
// column llmq reads, is not there: the database is not created yet or has no llmq schema (a
// wrong --database-url, or one never migrated), or an older one than this ctl's; "" otherwise.
func schemaHint(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "3D000": // invalid_catalog_name: the database does not exist
		return " (check --database-url, or run `ctl migrate`, which creates it)"
	case "42P01": // undefined_table
		return " (this database has no llmq schema: check --database-url, or run `ctl migrate`)"
	case "42703": // undefined_column
		return " (this database's schema is older than this ctl: run `ctl migrate`)"
	}
	return ""
}

// unreachable marks err as "postgres unreachable" when connecting failed without an answer from
// the server (refused, DNS, timeout, TLS), as opposed to a server that answered with an error.
func unreachable(err error) error {
	var connErr *pgconn.ConnectError
	var pgErr *pgconn.PgError
	if errors.As(err, &connErr) && !errors.As(err, &pgErr) {
		return fmt.Errorf("postgres unreachable: %w", err)
	}
	return err
}

// databaseURL resolves the Postgres URL: --database-url (or LLMQ_DATABASE_URL), else the config
// file's, else the default. A URL migrations.ParseConfig refuses is refused here, naming the
// setting it came from (a *migrations.URLError: exit 2).
func databaseURL(c *cli.Context) (string, error) {
	u, setting := config.DefaultDatabaseURL, "the default database url"
	switch {
	case c.String("database-url") != "":
		u, setting = c.String("database-url"), "--database-url"
		if u == os.Getenv(config.EnvDatabaseURL) {
			setting = config.EnvDatabaseURL
		}
	case c.String("config") != "":
		cfg, err := config.LoadWithoutSecrets(c.String("config"), nil)
		if err != nil {
			return "", err
		}
		u, setting = cfg.DatabaseURL, "database_url (in the config file)"
	}
	if _, err := migrations.ParseConfig(u); err != nil {
		return "", migrations.NameURLSetting(err, setting)
	}
	return u, nil
}

// storeArgs are the global flags of this command line that choose its database and bound its
// statements (--config, --database-url, --timeout), shell-quoted, for a command line ctl prints to
// be run next (the next page): without them it would run against the default database. A value
// the environment gives alike is left out, and a database URL's password is masked (xxxxx).
func storeArgs(c *cli.Context) []string {
	var args []string
	for _, f := range []struct{ name, env string }{
		{"config", config.EnvConfig},
		{"database-url", config.EnvDatabaseURL},
	} {
		if v := c.String(f.name); v != "" && v != os.Getenv(f.env) {
			if f.name == "database-url" {
				v = maskPassword(v)
			}
			args = append(args, "--"+f.name, shellQuote(v))
		}
	}
	if c.IsSet("timeout") {
		args = append(args, "--timeout", c.Duration("timeout").String())
	}
	return args
}

// dsnPassword matches the password of a key=value connection string.
var dsnPassword = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)`)

// maskPassword is the database URL u with its password, if any, replaced by xxxxx.
func maskPassword(u string) string {
	if p, err := url.Parse(u); err == nil && p.User != nil {
		if _, ok := p.User.Password(); ok {
			return p.Redacted()
		}
	}
	return dsnPassword.ReplaceAllString(u, "${1}xxxxx")
}

// shellSafe matches the words a POSIX shell reads as written.
var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,-]+$`)

// shellQuote is s as one word of a POSIX shell's command line: as it is when the shell reads it
// so, else single-quoted.
func shellQuote(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// newPool opens a pool on the database at u, each connection bounded as the processes' are
// (migrations.ParseConfig: 5 s unless u sets connect_timeout), so that a Postgres that accepts
// and never answers fails the command instead of hanging it. With bound (not nil) each statement
// is bounded too (see statementBound; and watched, even with no bound); migrate's is not.
func newPool(ctx context.Context, u string, bound *statementBound) (*pgxpool.Pool, error) {
	cfg, err := migrations.ParseConfig(u)
	if err != nil {
		return nil, err
	}
	if bound != nil {
		bound.configure(cfg)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	return p, nil
}

// boundedPool opens a pool on the database at u whose statements are bounded by --timeout (none
// when it is 0), and watched either way for a COMMIT that got no answer.
func (a *app) boundedPool(c *cli.Context, u string) (*pgxpool.Pool, error) {
	a.bound = &statementBound{wait: c.Duration("timeout")} // not negative: see the app's Before
	return newPool(c.Context, u, a.bound)
}

// pool opens a pool on the database (see boundedPool), failing fast with a one-line error when
// unreachable or silent.
func (a *app) pool(c *cli.Context) (*pgxpool.Pool, error) {
	u, err := databaseURL(c)
	if err != nil {
		return nil, err
	}
	p, err := a.boundedPool(c, u)
	if err != nil {
		return nil, err
	}
	ctx := c.Context
	if a.bound.wait > 0 { // a ping is no statement the tracer sees
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, a.bound.wait, errStatementTimeout)
		defer cancel()
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		if errors.Is(context.Cause(ctx), errStatementTimeout) {
			a.bound.timedOut.Store(true)
			return nil, fmt.Errorf("connect to postgres: %w", err)
		}
		return nil, unreachable(fmt.Errorf("connect to postgres: %w", err))
	}
	return p, nil
}

// defaultTimeout is --timeout's default: far above what one of ctl's statements takes (a batch
// of 500 dead letters retried or purged, a day's statistics), and short enough for an operator
// at a terminal to wait for.
const defaultTimeout = 30 * time.Second

// errStatementTimeout is the cause of a statement's context ended by --timeout.
var errStatementTimeout = errors.New("postgres statement timed out (--timeout)")

// statementBound is a pgx tracer that bounds each statement of a command's pool (a query with
// the reading of its rows, an exec, a transaction's begin and commit, a batch) by wait: a
// Postgres that is slow (a lock a long transaction holds, an I/O stall) or silent (a partition,
// a failover behind a moved address) fails the command rather than hang it. pgx cancels the
// statement and closes its connection. It records that it fired, for run's message, and whether
// a COMMIT, or a statement that writes sent outside a transaction, got no answer (it may have
// been applied). With wait 0 (--timeout 0) it bounds nothing, and only records the latter.
type statementBound struct {
	wait     time.Duration
	timedOut atomic.Bool
	// commitCut records that a transaction's COMMIT was cut: it may have been applied.
	commitCut atomic.Bool
	// commitLost records that a transaction's COMMIT was sent and its connection failed before
	// Postgres answered (not cut by wait): it may have been applied.
	commitLost atomic.Bool
	// writeCut and writeLost are commitCut and commitLost of a statement that writes sent
	// outside a transaction (autocommit: its own transaction, committed as it ends): it may
	// have been applied.
	writeCut, writeLost atomic.Bool
}

// configure makes b the tracer of the pool of cfg and, with a bound, the judge of which
// connection to ping before an acquire hands it out (shouldPing, prepareConn).
func (b *statementBound) configure(cfg *pgxpool.Config) {
	cfg.ConnConfig.Tracer = b
	if b.wait > 0 {
		cfg.ShouldPing = b.shouldPing
		cfg.PrepareConn = b.prepareConn
	}
}

// boundCancel is the context key of a bounded statement's cancel.
type boundCancel struct{}

// boundSQL is the context key of a bounded statement's SQL text.
type boundSQL struct{}

// boundWrite is the context key marking a statement that writes sent outside a transaction
// (autocommit), whose answer lost leaves it as uncertain as a COMMIT's.
type boundWrite struct{}

// rowLocks matches the row-locking clauses of a SELECT, which write nothing.
var rowLocks = regexp.MustCompile(`(?i)\bfor\s+(no\s+key\s+)?update\b`)

// writeWords matches the commands that change rows, alone or in a CTE.
var writeWords = regexp.MustCompile(`(?i)\b(insert|update|delete|merge)\b`)

// writes reports whether sql may change rows: it names INSERT, UPDATE, DELETE or MERGE (beside
// a SELECT's FOR UPDATE). A read it takes for a write only makes a lost answer's hint cautious.
func writes(sql string) bool {
	return writeWords.MatchString(rowLocks.ReplaceAllString(sql, ""))
}

func (b *statementBound) start(ctx context.Context) context.Context {
	if b.wait <= 0 {
		return ctx
	}
	ctx, cancel := context.WithTimeoutCause(ctx, b.wait, errStatementTimeout)
	return context.WithValue(ctx, boundCancel{}, cancel)
}

func (b *statementBound) end(ctx context.Context, conn *pgx.Conn, err error) {
	sql, _ := ctx.Value(boundSQL{}).(string)
	commit := strings.EqualFold(sql, "commit")
	write, _ := ctx.Value(boundWrite{}).(bool)
	cut, lost := &b.commitCut, &b.commitLost
	if write {
		cut, lost = &b.writeCut, &b.writeLost
	}
	var pgErr *pgconn.PgError
	switch {
	case err != nil && errors.Is(context.Cause(ctx), errStatementTimeout):
		b.timedOut.Store(true)
		if pgconn.SafeToRetry(err) && !conn.PgConn().IsClosed() {
			break // never sent (the bound fired first): the connection is as it was
		}
		// pgx is closing the connection (having sent the server a cancel, when the statement
		// went out; a message it failed to write at all is SafeToRetry, closed all the same); it
		// would read what is left on it for up to 15 s first, which a silent server never ends,
		// and the pool's close waits for that: the command ended 15 s after its message.
		_ = conn.PgConn().Conn().Close()
		if (commit || write) && !pgconn.SafeToRetry(err) {
			// Postgres may have committed it before the cancel came (see statementHint).
			cut.Store(true)
		}
	case err != nil && (commit || write) && !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err):
		// Sent, and no answer came (the connection lost, the command interrupted): Postgres
		// may have committed it. An error it answered (a deferred constraint, a serialization
		// failure) rolled it back; one SafeToRetry was never sent.
		lost.Store(true)
	}
	if cancel, ok := ctx.Value(boundCancel{}).(context.CancelFunc); ok {
		cancel()
	}
}

// commitUncertain reports whether a COMMIT of the command, or a statement that writes sent
// outside a transaction, got no answer (cut by --timeout, or its connection lost): what it
// changed may have been applied.
func (b *statementBound) commitUncertain() bool {
	return b != nil && (b.commitCut.Load() || b.commitLost.Load() || b.writeCut.Load() || b.writeLost.Load())
}

// TraceQueryStart implements pgx.QueryTracer: it bounds the statement, and marks one that
// writes outside a transaction (the connection idle in none: autocommit).
func (b *statementBound) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	ctx = context.WithValue(b.start(ctx), boundSQL{}, d.SQL)
	if conn.PgConn().TxStatus() == 'I' && writes(d.SQL) {
		ctx = context.WithValue(ctx, boundWrite{}, true)
	}
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (b *statementBound) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryEndData) {
	b.end(ctx, conn, d.Err)
}

// TraceAcquireStart implements pgxpool.AcquireTracer: it bounds the wait for a connection of the
// pool, which pings one idle for over a second before handing it out (prepareConn), a ping no
// statement's bound covers: a silent Postgres never answered it, and the command hung.
func (b *statementBound) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	if b.wait <= 0 {
		return ctx
	}
	return context.WithValue(b.start(ctx), pingDueKey{}, &pingDue{})
}

// TraceAcquireEnd implements pgxpool.AcquireTracer.
func (b *statementBound) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if d.Err != nil && errors.Is(context.Cause(ctx), errStatementTimeout) {
		b.timedOut.Store(true)
	}
	if cancel, ok := ctx.Value(boundCancel{}).(context.CancelFunc); ok {
		cancel()
	}
}

// pingDue says whether the connection an acquire holds is to be pinged (shouldPing), under
// pingDueKey in its context, for prepareConn.
type pingDue struct{ due bool }

type pingDueKey struct{}

// shouldPing never lets pgxpool ping: its ping, once the acquire's deadline fires, goes on in
// the background and gives the connection back to the pool if it succeeds, which a close of the
// connection at the deadline raced (the pool handed out a connection ctl had closed, and the next
// statement failed). It applies pgxpool's default rule (a connection idle over a second is
// pinged) for prepareConn, which pings in the acquire itself.
func (b *statementBound) shouldPing(ctx context.Context, params pgxpool.ShouldPingParams) bool {
	if p, ok := ctx.Value(pingDueKey{}).(*pingDue); ok {
		p.due = params.IdleDuration > time.Second
	}
	return false
}

// prepareConn pings the connection an acquire holds if shouldPing said it is due, within the
// acquire's bound. A failed ping closes the connection at once (pgx would drain it up to 15 s
// first, which a silent server never ends and the pool's close waits for) and has the pool
// destroy it: the acquire then tries another (pgxpool's rule), or fails with the ping's error
// once its bound fired. Only a connection whose ping failed is closed, and only one that
// answered goes back to the pool.
func (b *statementBound) prepareConn(ctx context.Context, conn *pgx.Conn) (bool, error) {
	if p, ok := ctx.Value(pingDueKey{}).(*pingDue); !ok || !p.due {
		return true, nil
	}
	if err := conn.Ping(ctx); err != nil {
		_ = conn.PgConn().Conn().Close()
		if ctx.Err() != nil {
			return false, fmt.Errorf("ping a pooled connection: %w", err)
		}
		return false, nil
	}
	return true, nil
}

// TraceBatchStart implements pgx.BatchTracer: it bounds the batch as one statement.
func (b *statementBound) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return b.start(ctx)
}

// TraceBatchQuery implements pgx.BatchTracer.
func (b *statementBound) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd implements pgx.BatchTracer.
func (b *statementBound) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, d pgx.TraceBatchEndData) {
	b.end(ctx, conn, d.Err)
}

// statementHint is what to make of a failed command one of whose statements --timeout cut, or
// whose COMMIT (or statement that writes outside a transaction) got no answer: the bound, what
// keeps Postgres from answering, and whether what it changed may have been applied; ""
// otherwise.
func (a *app) statementHint() string {
	if a.bound == nil {
		return ""
	}
	what, cut, lost := "a COMMIT", a.bound.commitCut.Load(), a.bound.commitLost.Load()
	if !cut && !lost {
		what, cut, lost = "a statement that writes", a.bound.writeCut.Load(), a.bound.writeLost.Load()
	}
	switch {
	case cut:
		return fmt.Sprintf(" (postgres did not answer within %s, --timeout, to %s: what it changed may have been applied; check with a list or show command (%s) "+
			"before running this one again; a lock a long transaction holds, or a slow, silent or failing-over server; what the command committed before stands)",
			a.bound.wait, what, checkCommand(a.group))
	case lost:
		return fmt.Sprintf(" (postgres did not answer %s, its connection failed or the command was interrupted: what it changed may have been applied; check with a list or show command (%s) "+
			"before running this one again; what the command committed before stands)", what, checkCommand(a.group))
	case a.bound.timedOut.Load():
		return fmt.Sprintf(" (postgres did not answer within %s, --timeout: a lock a long transaction holds, or a slow, silent or failing-over server; what the command committed before stands)", a.bound.wait)
	}
	return ""
}

// checkCommand is the command that shows what a command of group changes.
func checkCommand(group string) string {
	switch group {
	case "jobs":
		return "ctl jobs show ID"
	case "dead", "credentials", "tenants", "operators":
		return "ctl " + group + " list"
	case "batch":
		return "ctl batch files"
	}
	return "ctl --help"
}

func (a *app) migrateCommand() *cli.Command {
	return &cli.Command{
		Name:  "migrate",
		Usage: "create the database if needed and apply pending migrations",
		Action: func(c *cli.Context) error {
			if c.NArg() != 0 {
				return cli.Exit("usage: ctl migrate (it takes no arguments)", exitUsage)
			}
			u, err := databaseURL(c)
			if err != nil {
				return err
			}
			if err := migrations.EnsureDatabase(c.Context, u); err != nil {
				return unreachable(err)
			}
			p, err := newPool(c.Context, u, nil) // no --timeout: its index builds may take long
			if err != nil {
				return err
			}
			defer p.Close()
			// Another migration under way (a process starting, another ctl) holds the lock:
			// say so on the error output while it lasts, naming the holder, rather than wait in
			// silence. The wait has no bound but the operator's Ctrl-C.
			applied, err := migrations.UpWatch(c.Context, p, migrations.LockWatch{
				Report: func(w migrations.LockWait) {
					fmt.Fprintf(a.errOut, "ctl: %s; still waiting (Ctrl-C stops)\n", w)
				},
				First: a.lockReportFirst, Every: a.lockReportEvery,
			})
			// Those applied before a failure are committed: say so either way.
			for _, v := range applied {
				fmt.Fprintf(a.out, "applied migration %03d\n", v)
			}
			if err != nil {
				return err
			}
			if len(applied) == 0 {
				fmt.Fprintln(a.out, "schema is up to date")
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

// printList prints list to w: as a JSON array when asJSON (an empty list as [], never null);
// else, when the list is empty and none is set, the line none; else a table under header, its
// columns separated by tabs, one line of row's columns for each item.
func printList[T any](w io.Writer, asJSON bool, list []T, none, header string, row func(T) []string) error {
	if asJSON {
		if list == nil {
			list = []T{}
		}
		return writeJSON(w, list)
	}
	if len(list) == 0 && none != "" {
		_, err := fmt.Fprintln(w, none)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, item := range list {
		fmt.Fprintln(tw, strings.Join(row(item), "\t"))
	}
	return tw.Flush()
}
