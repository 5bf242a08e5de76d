package batchlane_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/alert"
	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestBatcher_LostIdleBatchWithoutACancelIsLost: a sent batch none of whose jobs waits any more,
// which the provider no longer knows (404) before llmq canceled it, on its poll or on the cancel
// itself, is counted lost, as a lost batch with waiting jobs is: no cancel of llmq's ended it.
// Before, it was counted canceled.
func TestBatcher_LostIdleBatchWithoutACancelIsLost(t *testing.T) {
	t.Parallel()
	for name, method := range map[string]string{"OnThePoll": http.MethodGet, "OnTheCancel": http.MethodPost} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var gone atomic.Bool
			b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
				return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if gone.Load() && r.Method == method && strings.HasPrefix(r.URL.Path, "/v1/batches/") {
						http.Error(w, `{"error":{"message":"No batch found","type":"invalid_request_error"}}`,
							http.StatusNotFound)
						return
					}
					sim.ServeHTTP(w, r)
				})
			}})
			bt := b.batcher(nil)
			b.canceledInBatch(t, bt)
			gone.Store(true)
			b.clock.Advance(time.Minute)
			once(t, bt)
			require.Zero(t, b.sim.BatchStats().Cancels, "no cancel reached the provider")
			require.Equal(t, float64(1), b.counter(t, "batches", "lost"))
			require.Zero(t, b.counter(t, "batches", "canceled"), "counted canceled without a cancel")
			b.clock.Advance(time.Hour)
			once(t, bt)
			require.Equal(t, float64(1), b.counter(t, "batches", "lost"), "closed once")
		})
	}
}

// TestBatcher_DeletedFileCountedOnceItsRowIsGone: a file deleted at the provider whose row
// Postgres then fails to remove is deleted again by the next pass (a 404 now, a delete), and
// counted deleted once, by the pass that removed its row. Before, both passes counted it.
func TestBatcher_DeletedFileCountedOnceItsRowIsGone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, setupOpts{provider: "openai"})
	_, err := b.pool.Exec(ctx, `INSERT INTO provider_batch_files (credential, file_id, batch, kind, next_try_at)
VALUES ('default', 'file-gone', gen_random_uuid(), 'ended', $1)`, b.clock.Now())
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, `CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'refused'; END $$;
CREATE TRIGGER refuse_delete BEFORE DELETE ON provider_batch_files FOR EACH ROW EXECUTE FUNCTION refuse_delete()`)
	require.NoError(t, err)
	require.Error(t, b.batcher(nil).Once(ctx), "the row's removal failed")
	require.Equal(t, 1, b.fileRows(t))
	require.Zero(t, b.counter(t, "file_deletes", "deleted"), "counted before its row was removed")

	_, err = b.pool.Exec(ctx, `DROP TRIGGER refuse_delete ON provider_batch_files`)
	require.NoError(t, err)
	once(t, b.batcher(nil))
	require.Zero(t, b.fileRows(t))
	require.Equal(t, float64(1), b.counter(t, "file_deletes", "deleted"))
}

// TestBatcher_FailedBatchSpendCapSaysTheBatchWasRefused: the jobs of a batch that failed as a
// whole with a spend-cap code say so, in their last error and their dead letter's alert: the
// provider refused the batch, not their request (none of which ran).
func TestBatcher_FailedBatchSpendCapSaysTheBatchWasRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{provider: "openai", front: failedBatchFront("insufficient_quota")})
	p := b.pausable(t)
	logs := &logtest.Buffer{}
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, Pauses: p.pauses,
		Alerter: alert.New(alert.Config{Logger: slog.New(slog.NewTextHandler(logs, nil)), Now: b.clock.Now}),
		Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg, Gate: p.gate}},
		Enqueue: b.enqueue})
	j := b.submit(t, "one", 0, 0)
	b.clock.Advance(fill)
	once(t, bt)
	b.clock.Advance(time.Minute)
	_ = bt.Once(t.Context())

	got := b.get(t, j.ID)
	require.Equal(t, jobs.StatusDead, got.Status)
	require.True(t, strings.HasPrefix(got.LastError.Message,
		"the job's batch was refused by the provider with a spend-cap code: "), got.LastError.Message)
	require.Zero(t, logs.Count("request was refused with a spend cap"), "the alert blames the job's request")
	require.Equal(t, 1, logs.Count("batch was refused by the provider with a spend-cap code"))
}

// failingScripts fails every script call (the pause is one) while down is set, as a Redis that
// refuses writes (a failover, OOM) does.
type failingScripts struct{ down atomic.Bool }

func (h *failingScripts) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *failingScripts) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.down.Load() && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			cmd.SetErr(redis.ErrClosed)
			return redis.ErrClosed
		}
		return next(ctx, cmd)
	}
}

func (h *failingScripts) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// pauseRefusingBatcher is a batcher of b's lane whose gate's Redis refuses every script call
// (the pause is one) while the returned hook's down is set.
func pauseRefusingBatcher(t *testing.T, b *testBundle) (*batchlane.Batcher, *failingScripts, *limiter.Gate) {
	t.Helper()
	rdb := redistest.Client(t)
	hook := &failingScripts{}
	rdb.AddHook(hook)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: redistest.Prefix(t), Now: b.clock.Now})
	require.NoError(t, err)
	gate := lim.Gate("sk-test", "default")
	return batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics,
		Pauses:  credpause.NewStore(b.pool, b.clock.Now),
		Lanes:   []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg, Gate: gate}},
		Enqueue: b.enqueue}), hook, gate
}

// TestBatcher_SpendCapPauseRedisRefusedIsRetried: a batch's spend cap whose pause Redis refused
// is paused again by a later poll, its jobs dead-lettered only then (the pause comes first, as
// online): the credential is not left sending to a key that cannot pay. That poll comes after
// the poll backoff, as after a failed poll, not at every pass: each poll reads the batch (and its
// results) again from the provider. Before, the jobs were dead-lettered and the pause never
// tried again; then the batch was polled again at every pass while Redis refused.
func TestBatcher_SpendCapPauseRedisRefusedIsRetried(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	var polls atomic.Int64
	failed := failedBatchFront("insufficient_quota")
	b := setup(t, setupOpts{provider: "openai", front: func(sim http.Handler) http.Handler {
		next := failed(sim)
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/batches/") {
				polls.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	}})
	bt, hook, gate := pauseRefusingBatcher(t, b)
	j := b.submit(t, "one", 0, 0)
	b.clock.Advance(fill)
	once(t, bt)
	hook.down.Store(true)
	b.clock.Advance(time.Minute)
	require.Error(t, bt.Once(ctx), "the pause Redis refused")
	require.NotEqual(t, jobs.StatusDead, b.get(t, j.ID).Status, "dead-lettered before its credential was paused")
	require.Equal(t, int64(1), polls.Load())

	// Given Redis still refusing, the passes before the backoff leave the batch alone,
	for range 3 {
		b.clock.Advance(time.Second)
		once(t, bt)
	}
	require.Equal(t, int64(1), polls.Load(), "polled again on every pass while Redis refused")
	// and the poll after it pauses the credential once Redis takes the pause.
	hook.down.Store(false)
	b.clock.Advance(10 * b.cfg.PollInterval)
	once(t, bt)
	ps, err := gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, ps.Paused, "the pause Redis refused was not tried again")
	require.Equal(t, jobs.StatusDead, b.get(t, j.ID).Status)
	require.Equal(t, float64(1), b.counter(t, "batches", "refused"))
}
