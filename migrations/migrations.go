// Package migrations holds llmq's SQL schema, embedded in every binary, and applies it.
//
// Files are named NNN_name.up.sql / NNN_name.down.sql. Up applies the missing versions in order,
// each in its own transaction, under a Postgres advisory lock so that several api and worker
// processes starting at once apply each version exactly once.
package migrations

import (
	"context"
	"embed"
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
// applied. It is safe to call from many processes at once: they serialise on an advisory lock.
func Up(ctx context.Context, pool *pgxpool.Pool) ([]int, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", advisoryLockKey); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	defer func() {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", advisoryLockKey)
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create schema_migrations: %w", err)
	}
	applied := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	for _, v := range versions {
		applied[v] = true
	}
	var done []int
	for _, m := range All() {
		if applied[m.Version] {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
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
