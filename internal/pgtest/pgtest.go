// Package pgtest gives each test its own Postgres database, cloned from a migrated template.
//
// The template is named after a hash of the embedded migrations, so it is built once per schema
// (under an advisory lock, so parallel test binaries build it once) and reused by every later run.
// Each test's clone is dropped in t.Cleanup. It is for _test.go files only.
package pgtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/migrations"
)

// DefaultURL is the server used when TEST_DATABASE_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// templateLockKey serialises template creation across test binaries.
const templateLockKey int64 = 0x6c6c6d7174706c00

func adminURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// URL creates a fresh migrated database for this test and returns its connection URL. The
// database is dropped when the test ends. The test fails (never skips) if Postgres is unreachable.
func URL(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg, err := pgx.ParseConfig(adminURL())
	if err != nil {
		t.Fatalf("parse TEST_DATABASE_URL: %v", err)
	}
	conn, err := connect(ctx, cfg)
	if err != nil {
		t.Fatalf("postgres unreachable at %s: %v", adminURL(), err)
	}
	defer conn.Close(context.Background())

	tpl, err := ensureTemplate(ctx, conn, cfg)
	if err != nil {
		t.Fatalf("prepare template database: %v", err)
	}
	name := "llmq_test_" + redistest.Rand()
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tpl)); err != nil {
		t.Fatalf("clone template: %v", err)
	}
	dropOnCleanup(t, cfg, name)
	return connString(cfg, name)
}

// dropOnCleanup drops database name when the test ends.
func dropOnCleanup(t testing.TB, cfg *pgx.ConnConfig, name string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := connect(ctx, cfg)
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
}

// connect opens an admin connection, waiting while the server has no connection slot free
// (SQLSTATE 53300): test binaries of several packages share it, and a slot frees as soon as one
// of their tests ends.
func connect(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	for {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		var pgErr *pgconn.PgError
		if err == nil || !errors.As(err, &pgErr) || pgErr.Code != "53300" {
			return conn, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Pool returns a pool on a fresh migrated database (see URL), closed when the test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), URL(t))
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func connString(cfg *pgx.ConnConfig, db string) string {
	u := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Host, cfg.Port, db)
	if cfg.Password != "" {
		u = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, cfg.Host, cfg.Port, db)
	}
	return u
}

func schemaHash() string {
	h := sha256.New()
	for _, m := range migrations.All() {
		fmt.Fprintf(h, "%d\x00%s\x00%s\x00", m.Version, m.Name, m.Up)
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// ensureTemplate returns the name of the migrated template database, creating it if needed.
func ensureTemplate(ctx context.Context, conn *pgx.Conn, cfg *pgx.ConnConfig) (string, error) {
	tpl := "llmq_tpl_" + schemaHash()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return "", err
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", templateLockKey) //nolint:errcheck

	var ready bool
	err := conn.QueryRow(ctx, "SELECT datistemplate FROM pg_database WHERE datname = $1", tpl).Scan(&ready)
	if err == nil && ready {
		return tpl, nil
	}
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", err
	}
	// Half-built by a crashed run, or absent: build it afresh.
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+tpl+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+tpl); err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P04" {
			return "", err
		}
	}
	pool, err := pgxpool.New(ctx, connString(cfg, tpl))
	if err != nil {
		return "", err
	}
	_, err = migrations.Up(ctx, pool)
	pool.Close()
	if err != nil {
		return "", err
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+tpl+" WITH is_template true"); err != nil {
		return "", err
	}
	sweepTemplates(ctx, conn, tpl)
	return tpl, nil
}

// sweepTemplates drops the templates of older schemas, so each migration change does not leave
// a database behind. One still being cloned refuses to drop; it goes on a later sweep.
func sweepTemplates(ctx context.Context, conn *pgx.Conn, keep string) {
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datname LIKE 'llmq\\_tpl\\_%' AND datname <> $1", keep)
	if err != nil {
		return
	}
	old, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, name := range old {
		id := pgx.Identifier{name}.Sanitize()
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+id+" WITH is_template false"); err == nil {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+id)
		}
	}
}

// ICUPool returns a pool on a fresh migrated database whose default collation is the ICU locale
// (the template has the server's; a database of another collation is made from template0),
// dropped when the test ends: for the statements whose order must not follow the collation.
func ICUPool(ctx context.Context, t testing.TB, locale string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgx.ParseConfig(adminURL())
	if err != nil {
		t.Fatalf("parse TEST_DATABASE_URL: %v", err)
	}
	conn, err := connect(ctx, cfg)
	if err != nil {
		t.Fatalf("postgres unreachable at %s: %v", adminURL(), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name := "llmq_test_icu_" + redistest.Rand()
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+name+` TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '`+
		locale+`' LOCALE 'C.UTF-8'`); err != nil {
		t.Fatalf("create a database of ICU locale %s: %v", locale, err)
	}
	dropOnCleanup(t, cfg, name)
	pool, err := pgxpool.New(ctx, connString(cfg, name))
	if err != nil {
		t.Fatalf("open pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if _, err := migrations.Up(ctx, pool); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	return pool
}
