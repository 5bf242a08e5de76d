package dispatch_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

// A pass ran its statements under the leader's context, with no time limit, and the leader only
// watches the lock's own connection: when another of the pool's connections fell silent (a
// partition, a failover behind a moved address) the pass hung until TCP gave up (hours) while its
// process kept the sweeper lock, and no process rescued orphans or re-enqueued missing tasks.
// Each statement (each page of the walk) is bounded by SweeperConfig.StatementTimeout now: the
// pass fails, and the next one, on a fresh connection, succeeds.
func TestSweeper_SilentConnectionFailsThePass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, statement string }{
		{"pruning event watches", "DELETE FROM job_watches"},
		{"reading the orphans' jobs", "WHERE id = ANY($1::uuid[])"},
		{"a page of the walk for missing tasks", "AND id > $1 AND lane = 'online'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
			pool, err := pgxpool.New(ctx, viaProxy+"&pool_max_conns=2")
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			// Before the pool's close, which waits for its connections: a statement still waiting
			// on a silent one (the old code's) ends with it.
			t.Cleanup(proxy.Cut)
			store := jobs.NewStore(pool, nil)
			tb := setupTasks(t)
			rdb := redistest.Client(t)
			job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "c",
				Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
			require.NoError(t, err)
			// Its task active on no live server: the pass reads the job's row to judge it.
			require.NoError(t, tb.enqueuer.Enqueue(ctx, job.ID, "", time.Time{}))
			orphan(t, rdb, tb.queue, job.ID)
			sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: store, Enqueuer: tb.enqueuer,
				Inspector: tb.inspector, Redis: rdb, StatementTimeout: time.Second})

			// When the connection the statement goes out on falls silent
			silenced := proxy.SilenceStatement(tc.statement)
			done := make(chan error, 1)
			go func() {
				_, err := sw.SweepOnce(t.Context())
				done <- err
			}()
			require.True(t, silenced(ctx), "the statement was not sent")

			// Then the pass fails soon after the bound, instead of waiting on it for hours
			select {
			case err := <-done:
				require.Error(t, err)
			case <-time.After(20 * time.Second):
				t.Fatal("the pass still waits on a silent connection")
			}
			// And the next pass, on a connection that answers, succeeds
			_, err = sw.SweepOnce(ctx)
			require.NoError(t, err)
		})
	}
}

// TestSweeper_StalledRedisFailsThePass checks that a pass whose Redis accepts and never answers
// fails within the clients' socket timeouts (go-redis's default 5 s read timeout, which asynq's
// clients keep: the URL sets none), as a silent Postgres connection does: the lock is given up and
// tried for again, instead of the pass hanging.
func TestSweeper_StalledRedisFailsThePass(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	b.Create(t, jobstest.Opts{})
	addr, end := redistest.Stalled(t)
	opt, err := dispatch.RedisConnOpt("redis://" + addr)
	require.NoError(t, err)
	client, insp := asynq.NewClient(opt), asynq.NewInspector(opt)
	rdb := dispatch.NewRedisClient(opt)
	t.Cleanup(func() {
		end() // first: the clients' closes do not wait on a stalled connection
		_ = rdb.Close()
		_ = insp.Close()
		_ = client.Close()
	})
	sw := dispatch.NewSweeper(dispatch.SweeperConfig{Store: b.Store, Enqueuer: dispatch.NewEnqueuer(client, "q", nil),
		Inspector: insp, Redis: rdb})
	done := make(chan error, 1)
	go func() {
		_, err := sw.SweepOnce(t.Context())
		done <- err
	}()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(60 * time.Second):
		end() // lets the pass end, for the leak check
		t.Fatal("the pass still waits on a stalled Redis")
	}
}
