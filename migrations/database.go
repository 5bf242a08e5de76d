package migrations

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/pgerr"
	"github.com/llmq/llmq/internal/pgwait"
)

// EnsureDatabase creates the database named in url when it does not exist yet, connecting to the
// server's "postgres" database to do so. It is what lets `make run` start on a fresh machine.
// A concurrent creation by another process (an api and a worker, or two replicas, starting at
// once on a fresh server) is not an error.
func EnsureDatabase(ctx context.Context, url string) error {
	// Parsed as a pool URL, so pool settings (pool_max_conns, ...) are accepted and left out of
	// this single connection.
	pcfg, err := ParseConfig(url)
	if err != nil {
		return err
	}
	cfg := pcfg.ConnConfig
	name := cfg.Database
	if name == "postgres" {
		return nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connect to postgres: %w", err)
	}
	admin := cfg.Copy()
	admin.Database = "postgres"
	aconn, err := pgx.ConnectConfig(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to postgres database to create %q: %w", name, err)
	}
	defer aconn.Close(context.WithoutCancel(ctx))
	_, err = aconn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	// duplicate_database when the other creation had committed before this one began; a unique
	// violation of pg_database's name index when the two ran at once (the loser waits for the
	// winner's commit, so the database exists either way).
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		return nil
	}
	if err != nil {
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}

// DefaultConnectTimeout bounds each connection Open's pool (and EnsureDatabase) makes to
// Postgres, its dial and its startup, when the database URL sets no connect_timeout (nor the
// environment PGCONNECT_TIMEOUT): a server that accepts connections and never answers (hung, or
// partitioned after the handshake) fails the try, which OpenWait logs and makes again, instead
// of hanging a starting process for ever without a word. The pool's other connections, the
// API's event listener and /readyz's own connection take it from the pool's config.
const DefaultConnectTimeout = 5 * time.Second

// URLError is a database URL that ParseConfig refuses though it parses: its message names the
// URL "the database url" unless Setting names where the user wrote it (the migrations package
// does not know: a caller that does sets it, see NameURLSetting).
type URLError struct {
	// Setting is the setting the URL came from, as the user wrote it ("--database-url",
	// "LLMQ_DATABASE_URL", "database_url"); "": "the database url".
	Setting string
	// Problem is what is wrong with it, worded to follow the setting's name.
	Problem string
}

func (e *URLError) Error() string {
	return cmp.Or(e.Setting, "the database url") + " " + e.Problem
}

// NameURLSetting is err with the setting a *URLError in it came from named as setting; any
// other error is returned as it is.
func NameURLSetting(err error, setting string) error {
	if ue, ok := errors.AsType[*URLError](err); ok {
		return &URLError{Setting: setting, Problem: ue.Problem}
	}
	return err
}

// ParseConfig parses url as a pool URL, with DefaultConnectTimeout unless it (or the
// environment) sets its own connect_timeout, which is kept (0 included: no bound). A URL that
// names no database (in its path, dbname= or PGDATABASE) gets Postgres's own default, the
// user's name, made explicit (so that EnsureDatabase sees it), and is refused when that name is
// postgres: the server's default database, where llmq's tables would land among whatever else
// lives there. Named, even as postgres, a database is taken as meant. A default_query_exec_mode
// of exec or simple_protocol is refused: pgx then sends arguments without Postgres's types for
// them, which llmq's statements need. Both refusals are *URLError. Every process and ctl open
// their pools through it.
func ParseConfig(url string) (*pgxpool.Config, error) {
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	if pcfg.ConnConfig.Database == "" {
		if pcfg.ConnConfig.User == "postgres" {
			return nil, &URLError{Problem: "names no database, and Postgres would take the server's default (postgres): add it to the path (postgres://host:5432/llmq) or set dbname= or PGDATABASE"}
		}
		pcfg.ConnConfig.Database = pcfg.ConnConfig.User
	}
	switch m := pcfg.ConnConfig.DefaultQueryExecMode; m {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol:
		return nil, &URLError{Problem: fmt.Sprintf("sets default_query_exec_mode=%s, which is not supported: llmq's statements need Postgres to describe their arguments' types (a job's JSON would go as bytea); leave it out (cache_statement) or use cache_describe or describe_exec",
			strings.ReplaceAll(m.String(), " ", "_"))}
	}
	if pcfg.ConnConfig.ConnectTimeout == 0 && !strings.Contains(url, "connect_timeout") && os.Getenv("PGCONNECT_TIMEOUT") == "" {
		pcfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	return pcfg, nil
}

// DefaultPoolMaxConns is the size of the pool Open makes when the database URL does not set
// pool_max_conns. pgxpool's own default (the number of CPUs, at least 4) left a worker's 200
// concurrent jobs queueing for 4 connections, and commits could not share WAL flushes.
const DefaultPoolMaxConns = 16

// Open creates the database if needed, opens a pool on it and applies pending migrations: what
// api and worker do at start-up. The caller closes the pool.
func Open(ctx context.Context, url string) (*pgxpool.Pool, error) {
	return openWatch(ctx, url, LockWatch{})
}

// openWatch is Open, its migrations' wait for the lock reported as w says.
func openWatch(ctx context.Context, url string, w LockWatch) (*pgxpool.Pool, error) {
	if err := EnsureDatabase(ctx, url); err != nil {
		return nil, err
	}
	pcfg, err := ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(url, "pool_max_conns") {
		pcfg.MaxConns = DefaultPoolMaxConns
	}
	// A request's wait for a connection is bounded when its context asks (pgwait.Bound: the
	// API's), instead of lasting as long as its client waits.
	pcfg.ConnConfig.Tracer = pgwait.Tracer{}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	if _, err := UpWatch(ctx, pool, w); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return pool, nil
}

// OpenWait is Open, tried again while Postgres cannot be reached (nothing listening, a reset
// connection, a server starting up, shutting down or out of connections) with a backoff doubling
// from 250 ms to 5 s, until ctx ends; other errors (a bad URL, a refused password, a failed
// migration, one an operator canceled) return at once. onRetry (may be nil) is told each failure
// and the wait before the next try. It is what lets a worker or API process start while Postgres
// is still coming up.
func OpenWait(ctx context.Context, url string, onRetry func(err error, wait time.Duration)) (*pgxpool.Pool, error) {
	return OpenWaitWatch(ctx, url, onRetry, LockWatch{})
}

// OpenWaitWatch is OpenWait, its migrations' wait for another process's migration lock reported
// as w says (UpWatch).
func OpenWaitWatch(ctx context.Context, url string, onRetry func(err error, wait time.Duration), w LockWatch) (*pgxpool.Pool, error) {
	wait := 250 * time.Millisecond
	for {
		pool, err := openWatch(ctx, url, w)
		if err == nil || !pgerr.Unavailable(err) || canceled(err) {
			return pool, err
		}
		if onRetry != nil {
			onRetry(err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (gave up waiting: %w)", err, context.Cause(ctx))
		case <-t.C:
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// canceled reports whether err is a statement the server canceled (57014: pg_cancel_backend;
// the migrations run without a statement_timeout) or cut at the session's lock_timeout (55P03,
// left as configured). pgerr.Unavailable counts them, as a statement of the API's may be tried
// again; a migration an operator stopped, or bounded, is not started again.
func canceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "57014" || pgErr.Code == "55P03")
}
