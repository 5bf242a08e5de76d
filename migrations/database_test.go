package migrations_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/migrations"
)

func TestOpen_CreatesDatabaseFromAPoolURL(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A database that does not exist yet, named in a URL carrying pool settings, which the pool
	// takes.
	u, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	name := "llmq_test_" + redistest.Rand()
	admin := *u
	u.Path = "/" + name
	q := u.Query()
	q.Set("pool_max_conns", "8")
	q.Set("pool_min_conns", "2") // the README's way to keep a pool open
	u.RawQuery = q.Encode()
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), admin.String())
		if err == nil {
			_, _ = c.Exec(context.Background(), fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
			_ = c.Close(context.Background())
		}
	})

	pool, err := migrations.Open(ctx, u.String())
	require.NoError(t, err)
	defer pool.Close()
	require.EqualValues(t, 8, pool.Config().MaxConns)
	require.EqualValues(t, 2, pool.Config().MinConns)
	// The pool's later connections (and those made with its config: the API's event listener,
	// /readyz's own) are bounded as the first: a server gone silent fails them, not hangs them.
	require.Equal(t, migrations.DefaultConnectTimeout, pool.Config().ConnConfig.ConnectTimeout)
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version) FROM schema_migrations").Scan(&version))
	require.Equal(t, migrations.All()[len(migrations.All())-1].Version, version)
}

// TestOpenWait starts a process's pool while Postgres is not reachable yet: OpenWait keeps trying
// until it is (here, until a proxy to it starts listening after two refused tries).
func TestOpenWait(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	target, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there until the proxy starts
	via := *target
	via.Host = addr

	retries := make(chan error, 10)
	proxyUp := make(chan struct{})
	go func() {
		for range 2 {
			<-retries
		}
		proxy, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("proxy listen: %v", err)
			return
		}
		t.Cleanup(func() { proxy.Close() })
		close(proxyUp)
		for {
			c, err := proxy.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target.Host)
				if err != nil {
					return
				}
				defer up.Close()
				go io.Copy(up, c) //nolint:errcheck
				io.Copy(c, up)    //nolint:errcheck
			}()
		}
	}()
	pool, err := migrations.OpenWait(ctx, via.String(), func(err error, _ time.Duration) {
		select {
		case retries <- err:
		default:
		}
	})
	require.NoError(t, err)
	defer pool.Close()
	<-proxyUp
	var one int
	require.NoError(t, pool.QueryRow(ctx, "SELECT 1").Scan(&one))

	// A problem that waiting cannot fix returns at once.
	_, err = migrations.OpenWait(ctx, "postgres://127.0.0.1:5432/x?sslmode=bogus", func(error, time.Duration) {
		t.Error("retried a bad URL")
	})
	require.Error(t, err)
}

// TestOpenWait_GivesUpWithItsContext checks the error path: while Postgres stays unreachable,
// OpenWait keeps trying until its context ends, and then says why it stopped.
func TestOpenWait_GivesUpWithItsContext(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tries := 0
	_, err = migrations.OpenWait(ctx, "postgres://postgres@"+addr+"/x?sslmode=disable", func(error, time.Duration) {
		if tries++; tries == 2 {
			cancel()
		}
	})
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 2, tries)
}

// TestEnsureDatabase_ConcurrentCreators starts several processes' EnsureDatabase at once on a
// database that does not exist yet (an api and a worker, or two replicas, starting together on a
// fresh server): each finds it missing and creates it, and those that lose the race must take
// the winner's database, not fail. Postgres reports a creation that lost to a concurrent one as
// a unique violation of pg_database's name index, not as duplicate_database.
func TestEnsureDatabase_ConcurrentCreators(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	admin := *u
	name := "llmq_test_" + redistest.Rand()
	u.Path = "/" + name
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), admin.String())
		if err == nil {
			_, _ = c.Exec(context.Background(), fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
			_ = c.Close(context.Background())
		}
	})

	const processes = 6
	start := make(chan struct{})
	errs := make(chan error, processes)
	for range processes {
		go func() {
			<-start
			errs <- migrations.EnsureDatabase(ctx, u.String())
		}()
	}
	close(start)
	for range processes {
		require.NoError(t, <-errs)
	}
	c, err := pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	require.NoError(t, c.Close(ctx))
}

// A database URL's own connect_timeout is kept (DefaultConnectTimeout applies only when it sets
// none): here a silent server fails the connection in its 1 s, well within the context's 4 s.
func TestEnsureDatabase_KeepsTheURLsConnectTimeout(t *testing.T) {
	t.Parallel()
	silent, _ := redistest.Stalled(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	err := migrations.EnsureDatabase(ctx, "postgres://postgres@"+silent+"/llmq_silent?sslmode=disable&connect_timeout=1")
	require.Error(t, err)
	require.NoError(t, ctx.Err(), "the URL's connect_timeout of 1 s did not end the connection: %v", err)
}

// TestParseConfig_RefusesAURLWithoutDatabase: a URL that names no database (no path, no dbname,
// no PGDATABASE) connects to the database named after its user: for the usual user, postgres,
// the server's default, where llmq's tables would be migrated: refused, saying how to name one.
// Another user's name is taken as Postgres takes it, made explicit. A named database, even
// "postgres", is taken as meant.
func TestParseConfig_RefusesAURLWithoutDatabase(t *testing.T) {
	t.Setenv("PGDATABASE", "")
	for _, url := range []string{
		"postgres://postgres@127.0.0.1:5432?sslmode=disable",
		"postgres://postgres@127.0.0.1:5432/?sslmode=disable",
		"postgresql://postgres:secret@db.example",
	} {
		_, err := migrations.ParseConfig(url)
		require.ErrorContains(t, err, "names no database", url)
		require.NotContains(t, err.Error(), "secret", "the error does not quote the URL's password")
	}
	for url, database := range map[string]string{
		"postgres://postgres@127.0.0.1:5432/llmq?sslmode=disable":        "llmq",
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable":    "postgres",
		"postgres://postgres@127.0.0.1:5432?dbname=llmq&sslmode=disable": "llmq",
		"postgresql://u:p@db.example":                                    "u",
		"postgres://llmq@127.0.0.1:5432?sslmode=disable":                 "llmq",
	} {
		cfg, err := migrations.ParseConfig(url)
		require.NoError(t, err, url)
		require.Equal(t, database, cfg.ConnConfig.Database, url)
	}
	t.Setenv("PGDATABASE", "llmq")
	_, err := migrations.ParseConfig("postgres://postgres@127.0.0.1:5432?sslmode=disable")
	require.NoError(t, err, "PGDATABASE names it")
}

// TestParseConfig_RefusesExecModesWithoutDescribe: pgx's exec and simple_protocol modes send
// arguments without asking Postgres their types, so a job's JSON went as bytea (every submit
// failed: "invalid input syntax for type json") and an attempt's columns could not be encoded;
// such a URL is refused at start, naming the setting and the modes that work. Those modes
// are taken.
func TestParseConfig_RefusesExecModesWithoutDescribe(t *testing.T) {
	const base = "postgres://postgres:secret@127.0.0.1:5432/llmq?sslmode=disable&default_query_exec_mode="
	for _, mode := range []string{"exec", "simple_protocol"} {
		_, err := migrations.ParseConfig(base + mode)
		require.ErrorContains(t, err, "the database url sets default_query_exec_mode="+mode+", which is not supported", mode)
		require.ErrorContains(t, err, "cache_statement", mode)
		require.NotContains(t, err.Error(), "secret", "the error does not quote the URL's password")
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec"} {
		_, err := migrations.ParseConfig(base + mode)
		require.NoError(t, err, mode)
	}
}
