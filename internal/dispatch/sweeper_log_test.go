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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
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
			require.Eventually(t, tries, 30*time.Second, 5*time.Millisecond)
			require.Equal(t, 1, logs.Count(`level=WARN`), logs.String())
			const hidden = ` failed; further errors are not logged until it succeeds"`
			require.Equal(t, 1, logs.Count(`msg="`+tc.what+hidden), logs.String())

			down.Store(false)
			require.Eventually(t, func() bool {
				return logs.Count(`msg="`+tc.what+` succeeds again" failures=`) == 1
			}, 30*time.Second, 5*time.Millisecond, logs.String())
			require.Equal(t, 2, logs.Count(`level=`), logs.String())
		})
	}
}

// TestSweeper_CountsFailedPasses: a pass that fails counts in llmq_sweeper_pass_failures_total by
// the store that failed it, postgres or redis, both series there at 0 from the start. Only the
// last success's time told of a sweeper in trouble (LLMQSweeperStalled, once 10 minutes had
// passed), not of passes that fail now and then, nor on which store.
func TestSweeper_CountsFailedPasses(t *testing.T) {
	t.Parallel()
	const name = "llmq_sweeper_pass_failures_total"
	for _, failing := range []string{"postgres", "redis"} {
		t.Run(failing, func(t *testing.T) {
			t.Parallel()
			b := jobstest.New(t)
			tb := setupTasks(t)
			var down atomic.Bool
			var failed atomic.Int64
			rdb := redistest.Client(t)
			rdb.AddHook(&failCommands{down: &down, failed: &failed})
			reg := prometheus.NewRegistry()
			sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: tb.enqueuer,
				Inspector: tb.inspector, Redis: rdb, Metrics: dispatch.NewMetrics(reg)})
			failures := func(store string) float64 {
				t.Helper()
				return labeledCounter(t, reg, name, "store", store)
			}
			require.Zero(t, failures("postgres"), "%s{store=postgres} at 0 from the start", name)
			require.Zero(t, failures("redis"), "%s{store=redis} at 0 from the start", name)
			// A pass that succeeds counts nothing.
			_, err := sw.SweepOnce(t.Context())
			require.NoError(t, err)

			// Given the store failing (Postgres: its first statement cannot run; Redis: every
			// command refused), two passes fail, and each is counted on that store.
			if failing == "postgres" {
				_, err = b.Pool.Exec(t.Context(),
					`ALTER TABLE job_watches RENAME TO job_watches_gone`)
				require.NoError(t, err)
			} else {
				down.Store(true)
			}
			for range 2 {
				_, err = sw.SweepOnce(t.Context())
				require.Error(t, err)
			}
			other := map[string]string{"postgres": "redis", "redis": "postgres"}[failing]
			require.Equal(t, 2.0, failures(failing))
			require.Zero(t, failures(other))
		})
	}
}
