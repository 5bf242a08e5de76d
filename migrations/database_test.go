package migrations_test

import (
	"context"
	"fmt"
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
	// A database that does not exist yet, named in a URL carrying pool settings.
	u, err := url.Parse(pgtest.URL(t))
	require.NoError(t, err)
	name := "llmq_test_" + redistest.Rand()
	admin := *u
	u.Path = "/" + name
	q := u.Query()
	q.Set("pool_max_conns", "8")
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
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(version) FROM schema_migrations").Scan(&version))
	require.Equal(t, migrations.All()[len(migrations.All())-1].Version, version)
}
