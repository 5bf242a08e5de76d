package dispatch_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// failCommands fails every single command while down is set, counting the failures in failed.
type failCommands struct {
	down   *atomic.Bool
	failed *atomic.Int64
}

func (*failCommands) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failCommands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.down.Load() {
			f.failed.Add(1)
			return errDown
		}
		return next(ctx, cmd)
	}
}
func (*failCommands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

var errDown = errors.New("down")

// TestSweeper_FailuresLogOnce: while the sweeper's tries to lead fail (Postgres away, here every
// connection refused) or its passes do (Redis away: each try leads, fails its pass and gives the
// lock up), every Interval, the first failure is logged and not the others, and the try or pass
// that succeeds again logs the run's count: a line every Interval (10 s) for the whole outage,
// in every worker, buried the log.
func TestSweeper_FailuresLogOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ store, what string }{
		{"Postgres", "sweeper leadership"},
		{"Redis", "sweep pass"},
	} {
		t.Run(tc.store, func(t *testing.T) {
			t.Parallel()
			var down atomic.Bool
			var failed atomic.Int64
			down.Store(true)
			cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
			require.NoError(t, err)
			rdb := redistest.Client(t)
			if tc.store == "Postgres" {
				cfg.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
					if down.Load() {
						failed.Add(1)
						return errDown
					}
					return nil
				}
			} else {
				rdb.AddHook(&failCommands{down: &down, failed: &failed})
			}
			pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			tb := setupTasks(t)
			logs := &logtest.Buffer{}
			// The interval is the lock's check too: at 10 ms, a loaded host's slow ping lost the
			// lock, a leadership failure of its own beside the one looked for.
			sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: jobs.NewStore(pool, nil),
				Enqueuer: tb.enqueuer, Inspector: tb.inspector, Redis: rdb, Interval: 200 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(logs, nil))})
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = sw.Run(ctx)
			}()
			t.Cleanup(func() { cancel(); <-done })

			tries := func() bool { return failed.Load() >= 5 }
			require.Eventually(t, tries, 10*time.Second, 5*time.Millisecond)
			require.Equal(t, 1, logs.Count(`level=WARN`), logs.String())
			const hidden = ` failed; further errors are not logged until it succeeds"`
			require.Equal(t, 1, logs.Count(`msg="`+tc.what+hidden), logs.String())

			down.Store(false)
			require.Eventually(t, func() bool {
				return logs.Count(`msg="`+tc.what+` succeeds again" failures=`) == 1
			}, 10*time.Second, 5*time.Millisecond, logs.String())
			require.Equal(t, 2, logs.Count(`level=`), logs.String())
		})
	}
}
