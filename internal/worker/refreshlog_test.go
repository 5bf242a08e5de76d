package worker_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/worker"
)

// refreshSetup is setup for a worker that refreshes the credentials' state every 20 ms and logs
// to the buffer it returns.
func refreshSetup(t *testing.T) (*testBundle, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	return setup(t, worker.Options{PauseRefreshInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}), logs
}

// TestWorker_BreakerRefreshFailuresLogOnce: the pause refresh reads each breaker's state (for
// llmq_breaker_state) every 15 s; while those reads fail (Redis away, here a breaker key of the
// wrong type) the first failure is logged and not the others: a line per credential per refresh
// per worker, for the whole outage, buried the log beside the pause refresh's own.
func TestWorker_BreakerRefreshFailuresLogOnce(t *testing.T) {
	t.Parallel()
	b, logs := refreshSetup(t)
	ctx := context.Background()
	rdb := redistest.Client(t)
	cred, _ := b.cfg.Credential("default")
	require.NoError(t, rdb.Set(ctx, b.prefix+redisscript.CredentialTag(cred.LimiterID())+":cb", "not a hash", 0).Err())
	b.run(t)

	awaitRefreshes(ctx, t, rdb, b.prefix)
	require.Equal(t, 1, logs.Count(`msg="refresh credential breaker state`), "a run of failed breaker reads logs once")
}

// TestWorker_PauseRefreshFailuresLogOnce: the pause refresh reads each credential's pause state
// every 15 s, from Redis and then from Postgres; while those reads fail (Redis away, here each
// credential's pause key of the wrong type; Postgres away, here its table renamed) the first
// failure is logged and not the others, and the refresh that succeeds again logs the run's
// count: a line per credential per refresh per worker, for the whole outage, buried the log.
func TestWorker_PauseRefreshFailuresLogOnce(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"Redis", "Postgres"} {
		t.Run(store, func(t *testing.T) {
			t.Parallel()
			b, logs := refreshSetup(t)
			ctx := t.Context()
			rdb := redistest.Client(t)
			db, err := pgx.Connect(ctx, b.cfg.DatabaseURL)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, db.Close(context.Background())) })
			var broken []string
			for _, c := range b.cfg.Credentials {
				broken = append(broken, b.prefix+redisscript.CredentialTag(c.LimiterID())+":pause")
			}
			if store == "Redis" {
				for _, k := range broken {
					require.NoError(t, rdb.Set(ctx, k, "not a hash", 0).Err())
				}
			} else {
				_, err := db.Exec(ctx, `ALTER TABLE credential_pauses RENAME TO credential_pauses_away`)
				require.NoError(t, err)
			}
			b.run(t)

			awaitRefreshes(ctx, t, rdb, b.prefix)
			require.Equal(t, 1, logs.Count(`msg="refresh credential pause state`), logs.String())
			require.Equal(t, 1, logs.Count(`msg="refresh credential pause state failed;`), logs.String())

			if store == "Redis" {
				require.NoError(t, rdb.Del(ctx, broken...).Err())
			} else {
				_, err := db.Exec(ctx, `ALTER TABLE credential_pauses_away RENAME TO credential_pauses`)
				require.NoError(t, err)
			}
			require.Eventually(t, func() bool {
				return logs.Count(`msg="refresh credential pause state succeeds again" failures=`) == 1
			}, 30*time.Second, 5*time.Millisecond, logs.String())
			require.Equal(t, 2, logs.Count(`msg="refresh credential pause state`), logs.String())
		})
	}
}

// TestWorker_CredentialTagFailuresLogOnce: each refresh (15 s) publishes the credentials' tags
// for the console; while that write fails (Redis away, here the index a key of the wrong type)
// the first failure is logged and not the others, and the write that succeeds again logs the
// run's count: a line per refresh per worker, for the whole outage, buried the log.
func TestWorker_CredentialTagFailuresLogOnce(t *testing.T) {
	t.Parallel()
	b, logs := refreshSetup(t)
	ctx := t.Context()
	rdb := redistest.Client(t)
	index := redisscript.CredentialIndexKey(b.prefix)
	require.NoError(t, rdb.Set(ctx, index, "not a hash", 0).Err())
	b.run(t)

	// Each refresh restores the pause state of a credential whose Redis state is gone: a deleted
	// mark of a known state written again is a refresh (and its publish) over.
	cred, _ := b.cfg.Credential("default")
	awaitWrites(ctx, t, rdb, b.prefix+redisscript.CredentialTag(cred.LimiterID())+":pause:known")
	const msg = `msg="publish credential tags for the console`
	require.Equal(t, 1, logs.Count(msg), logs.String())
	const hidden = ` failed; further errors are not logged until it succeeds"`
	require.Equal(t, 1, logs.Count(msg+hidden), logs.String())

	require.NoError(t, rdb.Del(ctx, index).Err())
	require.Eventually(t, func() bool {
		return logs.Count(msg+` succeeds again" failures=`) == 1
	}, 30*time.Second, 5*time.Millisecond, logs.String())
	require.Equal(t, 2, logs.Count(msg), logs.String())
}

// awaitRefreshes returns once three refreshes of the pause state are over, at least: each
// refresh publishes the credentials' tags first, so a deleted index written again is a refresh
// begun, the one before it over.
func awaitRefreshes(ctx context.Context, t *testing.T, rdb redis.UniversalClient, prefix string) {
	t.Helper()
	awaitWrites(ctx, t, rdb, redisscript.CredentialIndexKey(prefix))
}

// awaitWrites returns once key, which each refresh writes, has been written four times: it is
// deleted after each write, and each refresh writes it again.
func awaitWrites(ctx context.Context, t *testing.T, rdb redis.UniversalClient, key string) {
	t.Helper()
	written := func() bool { n, err := rdb.Exists(ctx, key).Result(); return err == nil && n == 1 }
	for range 4 {
		require.Eventually(t, written, 30*time.Second, 5*time.Millisecond)
		require.NoError(t, rdb.Del(ctx, key).Err())
	}
}
