// Package migrations holds llmq's SQL schema, embedded in every binary, and applies it.
//
// Files are named NNN_name.up.sql / NNN_name.down.sql. Up applies the missing versions in order,
// each in its own transaction, under a Postgres advisory lock so that several api and worker
// processes starting at once apply each version exactly once. It refuses a missing version
// numbered below one the database has applied: a new migration takes a number above the newest
// (gaps, such as 014, stay gaps).
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed *.sql
var files embed.FS

// advisoryLockKey serialises migrations across processes ("llmqmigr" as an int64).
const advisoryLockKey int64 = 0x6c6c6d716d696772

// Migration is one schema version.
type Migration struct {
	Version int
	Name    string
	Up      string
}

// All returns the embedded migrations in version order. It panics only if the embedded files are
// malformed, which is a build-time programming error.
func All() []Migration {
	entries, err := fs.Glob(files, "*.up.sql")
	if err != nil {
		panic(err)
	}
	out := make([]Migration, 0, len(entries))
	for _, name := range entries {
		num, rest, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic(fmt.Sprintf("migrations: bad file name %q", name))
		}
		body, err := files.ReadFile(name)
		if err != nil {
			panic(err)
		}
		out = append(out, Migration{Version: v, Name: strings.TrimSuffix(rest, ".up.sql"), Up: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// Up applies every migration not yet recorded in schema_migrations and returns the versions it
// applied, also when it fails (those are committed). It is safe to call from many processes at
// once: they serialise on an advisory lock. It refuses a read-only database, and needs the
// CREATE privilege only when there is something to apply. It applies nothing when a missing
// version is numbered below the newest one applied (an error naming both). Its wait for the
// lock is silent: UpWatch reports it.
func Up(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	return UpWatch(ctx, pool, LockWatch{})
}

// UpWatch is Up, its wait for another session's migration lock reported as w says (with the
// holder's pid, user, application and client where Postgres shows them), while it waits without
// bound but ctx's.
func UpWatch(ctx context.Context, pool *pgxpool.Pool, w LockWatch) ([]int, error) {
	return upWith(ctx, pool, w, All())
}

// upWith is UpWatch applying the migrations ms (in version order) instead of All's.
func upWith(ctx context.Context, pool *pgxpool.Pool, w LockWatch, ms []Migration) ([]int, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	// The migrations' session is their own: taken out of the pool and closed at the end (which
	// also lets go of the lock), so its settings reach none of the pool's other users. Its
	// statements have no statement_timeout (nor, from Postgres 17, transaction_timeout): one
	// set for the role or database, sized for the application's queries, cut a migration that
	// took longer (an index build on a large jobs table, or a wait for the lock behind another
	// process's), and every start tried it again. With no timeout, the server checks every
	// second that the session's client is still there (client_connection_check_interval, from
	// Postgres 14): a migration whose process died, or whose network was cut, sends no cancel,
	// and its session, waiting for a lock, would otherwise keep the migration lock and its
	// place in the queue for the lock on jobs (every write behind it) for as long as it waits.
	c := conn.Hijack()
	defer c.Close(context.WithoutCancel(ctx))
	if _, err := c.Exec(ctx, `SELECT set_config(name,
		CASE name WHEN 'client_connection_check_interval' THEN '1s' ELSE '0' END, false)
		FROM pg_settings
		WHERE name IN ('statement_timeout', 'transaction_timeout', 'client_connection_check_interval')`); err != nil {
		return nil, fmt.Errorf("clear statement_timeout: %w", err)
	}
	var locked bool
	if err := c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", advisoryLockKey).Scan(&locked); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	if !locked {
		// Another session migrates (or holds the lock and waits for its client): wait for it,
		// saying so while it lasts.
		stop := watchLock(ctx, pool, w)
		_, err := c.Exec(ctx, "SELECT pg_advisory_lock($1)", advisoryLockKey)
		stop()
		if err != nil {
			return nil, fmt.Errorf("take migration lock (another session holds it): %w", err)
		}
	}
	// A replica's URL given by mistake (or default_transaction_read_only) is refused here, by
	// name: with the schema up to date nothing below writes, and the process would start and
	// fail every write.
	var readOnly bool
	if err := c.QueryRow(ctx, "SELECT current_setting('transaction_read_only')::bool").Scan(&readOnly); err != nil {
		return nil, fmt.Errorf("read transaction_read_only: %w", err)
	}
	if readOnly {
		return nil, errors.New("the database is read-only (a standby, or default_transaction_read_only is on): give the primary's URL")
	}
	// Created only when missing: CREATE TABLE IF NOT EXISTS needs the CREATE privilege on the
	// schema even where the table exists, which a least-privilege role (its owner migrates
	// with `ctl migrate`) does not have. Such a role needs no more when nothing is to apply.
	var exists bool
	if err := c.QueryRow(ctx, "SELECT to_regclass('schema_migrations') IS NOT NULL").Scan(&exists); err != nil {
		return nil, fmt.Errorf("look for schema_migrations: %w", err)
	}
	if !exists {
		if _, err := c.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return nil, fmt.Errorf("create schema_migrations: %w", err)
		}
	}
	applied := map[int]bool{}
	rows, err := c.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	newest := 0
	for _, v := range versions {
		applied[v] = true
		newest = max(newest, v)
	}
	// A missing version below the newest applied one was numbered into the past (a gap, or a
	// number another branch took meanwhile): applied here it would run after the newer ones,
	// against a schema its author never saw, while a fresh database runs it before them.
	// Refused before anything is applied, so the database stays as the newer versions left it.
	for _, m := range ms {
		if !applied[m.Version] && m.Version < newest {
			return nil, fmt.Errorf("migration %03d_%s of this build is numbered below %03d, the newest this database has applied: it would run out of order, on a schema it was not written for; nothing was applied: deploy a build whose new migrations are numbered above %03d (its developers renumber them)", m.Version, m.Name, newest, newest)
		}
	}
	var done []int
	for _, m := range ms {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.Up); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return done, fmt.Errorf("apply migration %03d_%s: %w", m.Version, m.Name, err)
		}
		done = append(done, m.Version)
	}
	return done, nil
}
