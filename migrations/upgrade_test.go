package migrations_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/migrations"
)

// emptyDatabase returns the URL of a database that does not exist yet (Open creates it), the URL
// of its server's admin database and its name; the database is dropped when the test ends.
func emptyDatabase(t *testing.T) (dbURL, adminURL, name string) {
	t.Helper()
	u, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	admin := *u
	name = "llmq_test_" + redistest.Rand()
	u.Path = "/" + name
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin.String())
		if err != nil {
			t.Errorf("drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop %s: %v", name, err)
		}
	})
	return u.String(), admin.String(), name
}

// rollBack takes the database back to before version `to`+1 with the down files, as a database
// of that release would be.
func rollBack(ctx context.Context, t *testing.T, conn *pgx.Conn, to int) {
	t.Helper()
	all := migrations.All()
	for i := len(all) - 1; i >= 0 && all[i].Version > to; i-- {
		m := all[i]
		down, err := os.ReadFile(migrationFile(m, "down"))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, string(down))
		require.NoError(t, err, "down %03d", m.Version)
		_, err = conn.Exec(ctx, "DELETE FROM schema_migrations WHERE version = $1", m.Version)
		require.NoError(t, err)
	}
}

func migrationFile(m migrations.Migration, dir string) string {
	return fmt.Sprintf("%03d_%s.%s.sql", m.Version, m.Name, dir)
}

// migrated makes a new database, migrates it as a process starting on it does (Open), and
// returns its URL, its name and a connection to it, closed when the test ends.
func migrated(ctx context.Context, t *testing.T) (dbURL, name string, conn *pgx.Conn) {
	t.Helper()
	dbURL, _, name = emptyDatabase(t)
	migrateUp(ctx, t, dbURL)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	return dbURL, name, conn
}

// migrateUp applies what dbURL's database lacks, as a process of this release starting on it.
func migrateUp(ctx context.Context, t *testing.T, dbURL string) {
	t.Helper()
	pool, err := migrations.Open(ctx, dbURL)
	require.NoError(t, err)
	pool.Close()
}

// behindALongWrite migrates a new database, takes it back to 018 (019 builds an index on jobs)
// and holds a write's lock on jobs in the returned transaction (rolled back when the test ends),
// so that migration 019 waits for it.
func behindALongWrite(ctx context.Context, t *testing.T) (dbURL, name string, tx pgx.Tx) {
	t.Helper()
	dbURL, name, conn := migrated(ctx, t)
	rollBack(ctx, t, conn, 18)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	_, err = tx.Exec(ctx, "LOCK TABLE jobs IN ROW EXCLUSIVE MODE") // a long write, under way
	require.NoError(t, err)
	return dbURL, name, tx
}

// openWaitInBackground runs migrations.OpenWait on dbURL: retried gets its first retry's error,
// opened its result (the pool closed at once).
func openWaitInBackground(ctx context.Context, dbURL string) (retried, opened <-chan error) {
	r, o := make(chan error, 1), make(chan error, 1)
	go func() {
		p, err := migrations.OpenWait(ctx, dbURL, func(err error, _ time.Duration) {
			select {
			case r <- err:
			default:
			}
		})
		if err == nil {
			p.Close()
		}
		o <- err
	}()
	return r, o
}

// watcher is a connection of the test's own, outside the lock's transaction (whose view of the
// activity would stay), without a statement_timeout (its reads are not what is tested).
func watcher(ctx context.Context, t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	watch, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = watch.Close(context.WithoutCancel(ctx)) })
	_, err = watch.Exec(ctx, "SET statement_timeout = 0")
	require.NoError(t, err)
	return watch
}

// TestOpenWait_MigrationOutlastsStatementTimeout upgrades a database whose role or database sets a
// statement_timeout (common in production, sized for the API's queries) to a release whose
// migration builds an index on jobs: the build waits for a write under way on jobs (here, an open
// transaction holding it) longer than that timeout. The migration must run to its end, not be cut
// by the timeout and tried again for ever (each try blocking every write on jobs for the timeout,
// the process never starting, logged as "postgres not reachable yet").
func TestOpenWait_MigrationOutlastsStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, name, tx := behindALongWrite(ctx, t)
	watch := watcher(ctx, t, dbURL)
	_, err := watch.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET statement_timeout = '100ms'")
	require.NoError(t, err) // for the sessions opened from now on

	retried, opened := openWaitInBackground(ctx, dbURL)
	// Wait, on the server's clock, until the index build has waited ten times the timeout.
	for {
		var waited bool
		err := watch.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid() AND query LIKE '%CREATE INDEX jobs_unfinished_online_idx%'
			AND wait_event_type = 'Lock' AND clock_timestamp() - query_start > interval '1 second')`, name).Scan(&waited)
		require.NoError(t, err)
		if waited {
			break
		}
		select {
		case err := <-retried:
			t.Fatalf("the migration was cut and tried again: %v", err)
		case err := <-opened:
			t.Fatalf("OpenWait returned while the migration could not run: %v", err)
		case <-ctx.Done():
			t.Fatal("the index build never waited")
		case <-time.After(20 * time.Millisecond):
		}
	}
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-opened)
	select {
	case err := <-retried:
		t.Fatalf("the migration was cut and tried again: %v", err)
	default:
	}
	var version int
	require.NoError(t, watch.QueryRow(ctx, "SELECT max(version) FROM schema_migrations").Scan(&version))
	require.Equal(t, migrations.All()[len(migrations.All())-1].Version, version)
	// The pool's own sessions keep the database's setting.
	p, err := migrations.Open(ctx, dbURL)
	require.NoError(t, err)
	defer p.Close()
	var timeout string
	require.NoError(t, p.QueryRow(ctx, "SHOW statement_timeout").Scan(&timeout))
	require.Equal(t, "100ms", timeout)
}

// schema describes the public schema: columns, indexes, constraints (with their validity),
// triggers and functions.
func schema(ctx context.Context, t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var s string
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(string_agg(x, E'\n' ORDER BY x), '') FROM (
		SELECT format('column %s.%s %s %s %s', table_name, column_name, data_type, is_nullable, column_default)
			FROM information_schema.columns WHERE table_schema = 'public'
		UNION ALL SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public'
		UNION ALL SELECT format('constraint %s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid))
			FROM pg_constraint WHERE connamespace = 'public'::regnamespace
		UNION ALL SELECT 'trigger ' || pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal
		UNION ALL SELECT format('function %s %s', proname, md5(prosrc))
			FROM pg_proc WHERE pronamespace = 'public'::regnamespace) s(x)`).Scan(&s))
	return s
}

// TestDownMigrationsUndoTheirUps takes a migrated database down one version at a time with the
// down files (what an operator rolling a release back runs by hand; no binary applies them) and
// checks that each leaves the schema of the version before, that its up applies again on top
// and gives the same schema back, and that Up rebuilds the whole schema from the bottom.
func TestDownMigrationsUndoTheirUps(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, _, conn := migrated(ctx, t)

	top := schema(ctx, t, conn)
	all := migrations.All()
	for i := len(all) - 1; i >= 0; i-- {
		m := all[i]
		at := schema(ctx, t, conn)
		down, err := os.ReadFile(migrationFile(m, "down"))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, string(down))
		require.NoError(t, err, "down %03d", m.Version)
		before := schema(ctx, t, conn)
		require.NotEqual(t, at, before, "down %03d changed nothing", m.Version)
		_, err = conn.Exec(ctx, m.Up)
		require.NoError(t, err, "up %03d after its down", m.Version)
		require.Equal(t, at, schema(ctx, t, conn), "up %03d after its down", m.Version)
		_, err = conn.Exec(ctx, string(down))
		require.NoError(t, err, "down %03d again", m.Version)
		require.Equal(t, before, schema(ctx, t, conn), "down %03d again", m.Version)
		_, err = conn.Exec(ctx, "DELETE FROM schema_migrations WHERE version = $1", m.Version)
		require.NoError(t, err)
	}
	_, err := conn.Exec(ctx, "DROP TABLE schema_migrations")
	require.NoError(t, err)
	require.Empty(t, schema(ctx, t, conn))

	migrateUp(ctx, t, dbURL)
	require.Equal(t, top, schema(ctx, t, conn))
}

// TestOpen_RoleThatMayNotCreate starts a process whose role may read and write llmq's tables but
// not create any (a least-privilege application role; the schema's owner ran `ctl migrate`
// first): with nothing to apply, Open must not need CREATE on the schema.
func TestOpen_RoleThatMayNotCreate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, adminURL, name := emptyDatabase(t)
	pool, err := migrations.Open(ctx, dbURL) // the owner migrates
	require.NoError(t, err)
	pool.Close()

	role := "llmq_test_app_" + redistest.Rand()
	admin, err := pgx.Connect(ctx, adminURL)
	require.NoError(t, err)
	defer admin.Close(context.WithoutCancel(ctx))
	_, err = admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'app'")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
			return
		}
		defer c.Close(ctx)
		// The database first: the role's grants are in it.
		_, err = c.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		if err == nil {
			_, err = c.Exec(ctx, "DROP ROLE IF EXISTS "+role)
		}
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	owner, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer owner.Close(context.WithoutCancel(ctx))
	_, err = owner.Exec(ctx, `REVOKE CREATE ON SCHEMA public FROM PUBLIC;
		GRANT USAGE ON SCHEMA public TO `+role+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO `+role)
	require.NoError(t, err)

	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.UserPassword(role, "app")
	pool, err = migrations.Open(ctx, u.String())
	require.NoError(t, err)
	defer pool.Close()
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&n))

	// A migration still to apply fails on the missing privilege, naming the migration.
	rollBack(ctx, t, owner, 19)
	_, err = migrations.Open(ctx, u.String())
	require.ErrorContains(t, err, "apply migration 020_credential_pauses")
	require.ErrorContains(t, err, "permission denied")
}

// TestOpenWait_ReadOnlyDatabase gives a process a database it may only read (a standby's URL by
// mistake; here default_transaction_read_only), its schema up to date: OpenWait refuses it at
// once, saying so, rather than starting a process whose every write fails.
func TestOpenWait_ReadOnlyDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, _, name := emptyDatabase(t)
	pool, err := migrations.Open(ctx, dbURL)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET default_transaction_read_only = on")
	pool.Close()
	require.NoError(t, err)

	_, err = migrations.OpenWait(ctx, dbURL, func(err error, _ time.Duration) {
		t.Errorf("retried: %v", err)
	})
	require.ErrorContains(t, err, "the database is read-only")
}

// TestOpen_ConcurrentStarters starts several processes at once on a database that does not
// exist yet (docker-compose's api and workers on a fresh server): each creates it or takes the
// winner's, the migrations are applied once, one process at a time, and all of them open.
func TestOpen_ConcurrentStarters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, _, _ := emptyDatabase(t)
	const processes = 4
	start := make(chan struct{})
	applied := make(chan error, processes)
	for range processes {
		go func() {
			<-start
			pool, err := migrations.Open(ctx, dbURL)
			if err == nil {
				pool.Close()
			}
			applied <- err
		}()
	}
	close(start)
	for range processes {
		require.NoError(t, <-applied)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	var rows, versions int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*), count(DISTINCT version) FROM schema_migrations").Scan(&rows, &versions))
	require.Equal(t, len(migrations.All()), rows)
	require.Equal(t, rows, versions)
}

// TestOpenWait_CanceledMigrationIsNotTriedAgain has an operator cancel a starting process's
// migration (pg_cancel_backend: it waits for the lock on jobs, and every write on jobs waits
// behind it). The process stops with the cancel's error; it does not log "postgres not
// reachable yet" and start the same migration again a moment later, for ever.
func TestOpenWait_CanceledMigrationIsNotTriedAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, name, tx := behindALongWrite(ctx, t)

	retried, opened := openWaitInBackground(ctx, dbURL)
	watch := watcher(ctx, t, dbURL)
	for {
		var canceled bool
		err := watch.QueryRow(ctx, `SELECT coalesce(bool_or(pg_cancel_backend(pid)), false) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid() AND query LIKE '%CREATE INDEX jobs_unfinished_online_idx%'
			AND wait_event_type = 'Lock'`, name).Scan(&canceled)
		require.NoError(t, err)
		if canceled {
			break
		}
		select {
		case err := <-opened:
			t.Fatalf("OpenWait returned while the migration could not run: %v", err)
		case <-ctx.Done():
			t.Fatal("the index build never waited")
		case <-time.After(20 * time.Millisecond):
		}
	}
	select {
	case err := <-opened:
		require.ErrorContains(t, err, "apply migration 019_unfinished_online")
		require.ErrorContains(t, err, "57014")
	case err := <-retried:
		t.Fatalf("the canceled migration was tried again: %v", err)
	case <-ctx.Done():
		t.Fatal("OpenWait did not return")
	}
	require.NoError(t, tx.Rollback(ctx))
}

// TestOpenWait_LockTimeoutMigrationIsNotTriedAgain: a database that sets a lock_timeout (the
// decision "Migrations run without a statement_timeout" leaves it as configured) cuts a starting
// process's migration that waits for the lock on jobs (55P03). The process stops naming it; it
// does not take the cut for an unreachable Postgres (the API answers 55P03 503, as a statement
// Postgres could not run in time) and start the same migration again, for ever, each try
// blocking the writes on jobs for the timeout.
func TestOpenWait_LockTimeoutMigrationIsNotTriedAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, name, tx := behindALongWrite(ctx, t)
	watch := watcher(ctx, t, dbURL)
	_, err := watch.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET lock_timeout = '100ms'")
	require.NoError(t, err) // for the sessions opened from now on

	retried, opened := openWaitInBackground(ctx, dbURL)
	select {
	case err := <-opened:
		require.ErrorContains(t, err, "apply migration 019_unfinished_online")
		require.ErrorContains(t, err, "55P03")
	case err := <-retried:
		t.Fatalf("the migration cut by lock_timeout was tried again: %v", err)
	case <-ctx.Done():
		t.Fatal("OpenWait did not return")
	}
	require.NoError(t, tx.Rollback(ctx))
}

// TestOpen_AbandonedMigrationLetsGoOfItsLocks: a starting process dies (SIGKILL, out of memory,
// its host lost) or its network is cut while its migration waits for the lock on jobs behind a
// long write. No cancel request reaches the server, and its session does not read from its
// client while it waits: with no statement_timeout it waited on, queued for the lock on jobs
// (every write on jobs behind it) and holding the migration lock (every process started in its
// place waiting for it), until that write ended, then built the index for nobody. The session
// must end soon after its client is gone.
func TestOpen_AbandonedMigrationLetsGoOfItsLocks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, name, tx := behindALongWrite(ctx, t)

	proxy, proxyURL := pgtest.NewProxy(t, dbURL)
	opened := make(chan error, 1)
	go func() {
		p, err := migrations.Open(ctx, proxyURL)
		if err == nil {
			p.Close()
		}
		opened <- err
	}()

	watch := watcher(ctx, t, dbURL)
	var pid int
	for pid == 0 {
		err := watch.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid() AND query LIKE '%CREATE INDEX jobs_unfinished_online_idx%'
			AND wait_event_type = 'Lock'`, name).Scan(&pid)
		require.NoError(t, err)
		if pid != 0 {
			break
		}
		select {
		case err := <-opened:
			t.Fatalf("Open returned while the migration could not run: %v", err)
		case <-ctx.Done():
			t.Fatal("the index build never waited")
		case <-time.After(20 * time.Millisecond):
		}
	}
	proxy.Cut() // the process dies, no cancel request sent
	select {
	case err := <-opened:
		require.Error(t, err)
	case <-ctx.Done():
		t.Fatal("Open did not return when its connection was cut")
	}

	// The write under way goes on; the abandoned session must go within 20 s (the server
	// checks for its client every second), letting go of the migration lock.
	deadline := time.Now().Add(20 * time.Second)
	for {
		var alive, locked bool
		err := watch.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1),
			EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = $1)`, pid).Scan(&alive, &locked)
		require.NoError(t, err)
		if !alive && !locked {
			break
		}
		require.True(t, time.Now().Before(deadline),
			"20 s after its client left, the migration's session still waits for jobs (migration lock held: %v)", locked)
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	require.NoError(t, tx.Rollback(ctx))
}
