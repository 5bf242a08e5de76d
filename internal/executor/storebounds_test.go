package executor_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/tenant"
)

// boundsBundle is one row's world for TestExecutor_StoreStatementsAreBounded: a database reached
// through a proxy (the store's pool), a pool of its own beside it (the sessions that hold locks),
// and a limiter on the test's Redis namespace.
type boundsBundle struct {
	url   string
	proxy *pgtest.Proxy
	pool  *pgxpool.Pool // through the proxy
	store *jobs.Store
	other *pgxpool.Pool // direct: the lock holders'
	lim   *limiter.Limiter
	ok    executor.Upstream // a credential that answers
}

func newBoundsBundle(t *testing.T) *boundsBundle {
	t.Helper()
	ctx := t.Context()
	url := pgtest.URL(t)
	proxy, viaProxy := pgtest.NewProxy(t, url)
	pool, err := pgxpool.New(ctx, viaProxy+"&pool_max_conns=8")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Before the pool's close, which waits for its connections: a statement still waiting on a
	// silent one ends with it.
	t.Cleanup(proxy.Cut)
	other, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(other.Close)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	return &boundsBundle{url: url, proxy: proxy, pool: pool, store: jobs.NewStore(pool, nil), other: other, lim: lim,
		ok: executor.Upstream{Name: "ok", Kind: string(llm.KindAnthropic), Provider: simProvider(t, llmsim.Config{}, "sk-ok")}}
}

// hold runs sql (a lock) in a transaction of the direct pool, held until the returned release
// (or the test's end).
func (b *boundsBundle) hold(t *testing.T, sql string, args ...any) (release func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	tx, err := b.other.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			b.abandonedGone(t)
			_ = tx.Rollback(context.Background())
		})
	}
	t.Cleanup(release) // before the pool's close (cleanups run last-in first-out)
	return release
}

// abandonedGone waits until no statement waits for a lock in the test's database: the statement
// a bound abandoned is canceled by pgx's cancel request, which reaches Postgres after the
// delivery returned; let go before that, the abandoned statement took the lock and ran (a row's
// next delivery then found the job moved, or waited on it past its lock timeout).
func (b *boundsBundle) abandonedGone(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var waiting int
		err := b.other.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&waiting)
		require.NoError(t, err, "a statement the bound abandoned still waits for the lock")
		if waiting == 0 {
			return
		}
		select {
		case <-ctx.Done():
			require.Failf(t, "a statement the bound abandoned still waits for the lock", "%d waiting", waiting)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// create commits a queued job of helloRequest on credential (with fallbacks).
func (b *boundsBundle) create(t *testing.T, credential string, fallbacks ...string) *jobs.Job {
	t.Helper()
	job, _, err := b.store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: credential,
		Fallbacks: fallbacks, Request: helloRequest, MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	return job
}

// boundsCase is a row of TestExecutor_StoreStatementsAreBounded: arrange makes the job and the
// executor's config (Store and StoreTimeout are set after it) and blocks the statement (a lock
// held, or the statement silenced); it returns the delivery to run, what its answer must be
// within the bound, and what a next delivery does once the block is lifted (nil: nothing more).
type boundsCase struct {
	name    string
	arrange func(t *testing.T, b *boundsBundle, cfg *executor.Config) (deliver func(ctx context.Context, ex *executor.Executor) error,
		check func(t *testing.T, err error), after func(t *testing.T, ex *executor.Executor))
}

// failsOnTheStore: the delivery ends with the store's error (dispatch delivers it again), not a
// deferral nor a delivery handled.
func failsOnTheStore(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	var de *dispatch.DeferError
	require.NotErrorAs(t, err, &de)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// A worker's statements outside the store's batcher are each bounded by Config.StoreTimeout (a
// pause's writes and its resume's too): a row another session keeps locked, a table locked by an
// operator's migration, or a connection that fell silent ends the delivery at the bound, with the
// store's error (a pause's or a resume's is logged: the answer is stored), and the worker goes on. Without a bound,
// each waited as long as the delivery's task (an hour), or for ever for a write detached from
// the delivery's cancellation. (The deferral's write, jobs.Store.Postpone:
// TestExecutor_SilentConnectionDoesNotHoldADelivery.)
func TestExecutor_StoreStatementsAreBounded(t *testing.T) {
	t.Parallel()
	const bound = time.Second
	for _, tc := range []boundsCase{
		{
			// A slot due past MaxInlineWait is held in the job's row (jobs.Store.HoldSlot).
			name: "HoldSlot",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				limit := limiter.Limit{Rate: 0.1, Burst: 1} // a slot every 10 s
				gate := b.lim.Gate("sk-slow", "slow")
				_, err := gate.Reserve(t.Context(), limit) // the burst taken: the job's slot is 10 s out
				require.NoError(t, err)
				cfg.Upstreams = map[string]executor.Upstream{"slow": {Name: "slow", Provider: b.ok.Provider, Gate: gate, Limit: limit}}
				job := b.create(t, "slow")
				release := b.hold(t, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
				return deliverJob(job.ID), failsOnTheStore, defersOnceReleased(release, job.ID)
			},
		},
		{
			// A handed-over first delivery (ProcessFresh) whose slot, admitted before the job was
			// created (AdmitFirst), is due past MaxInlineWait holds it in the job's row
			// (runAdmitted: jobs.Store.HoldSlot).
			name: "HoldSlotAdmitted",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				limit := limiter.Limit{Rate: 0.1, Burst: 1} // a slot every 10 s
				gate := b.lim.Gate("sk-slow", "slow")
				_, err := gate.Reserve(t.Context(), limit) // the burst taken: the job's slot is 10 s out
				require.NoError(t, err)
				brk, err := breaker.New(redistest.Client(t), &breaker.Config{Prefix: redistest.Prefix(t) + "brk:"})
				require.NoError(t, err)
				circuit := brk.Circuit("sk-slow", "slow")
				a, err := circuit.Allow(t.Context()) // a warm breaker: AdmitFirst's ask admits
				require.NoError(t, err)
				_, err = circuit.Report(t.Context(), a, breaker.Success)
				require.NoError(t, err)
				cfg.Upstreams = map[string]executor.Upstream{"slow": {Name: "slow", Provider: b.ok.Provider, Gate: gate,
					Circuit: circuit, Limit: limit}}
				job := b.create(t, "slow")
				release := b.hold(t, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
				return func(ctx context.Context, ex *executor.Executor) error {
					adm := ex.AdmitFirst(ctx, job)
					if adm == nil {
						return errors.New("the first attempt was not admitted")
					}
					return ex.ProcessFresh(ctx, job, adm)
				}, failsOnTheStore, defersOnceReleased(release, job.ID)
			},
		},
		{
			// A job canceled while its row held a slot gives the slot back
			// (jobs.Store.TakeEndedSlot).
			name: "TakeEndedSlot",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				ctx := t.Context()
				cfg.Upstreams = map[string]executor.Upstream{"gated": {Name: "gated", Provider: b.ok.Provider, Gate: b.lim.Gate("sk-gated", "gated")}}
				job := b.create(t, "gated")
				held, err := b.store.HoldSlot(ctx, job.ID, time.Now().Add(time.Minute), 1, 0)
				require.NoError(t, err)
				require.True(t, held)
				_, err = b.store.Cancel(ctx, job.ID)
				require.NoError(t, err)
				release := b.hold(t, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
				return deliverJob(job.ID), failsOnTheStore, func(t *testing.T, ex *executor.Executor) {
					release()
					require.NoError(t, ex.Process(t.Context(), dispatch.Delivery{JobID: job.ID}))
					got, err := b.store.Get(t.Context(), job.ID)
					require.NoError(t, err)
					require.Nil(t, got.SlotSeq, "the ended job's slot is taken from its row")
				}
			},
		},
		{
			// A job whose credential is no longer configured moves to its fallback
			// (jobs.Store.NextCredential).
			name: "NextCredential",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				cfg.Upstreams = map[string]executor.Upstream{"ok": b.ok}
				job := b.create(t, "removed", "ok") // before the executor: not a newer config's
				release := b.hold(t, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID)
				return deliverJob(job.ID), failsOnTheStore, succeedsOnceReleased(b, release, job.ID)
			},
		},
		{
			// Fair queueing reads the tenant's weight (Config.TenantWeight: tenant.Store.Weight).
			name: "TenantWeight",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				up := b.ok
				up.Gate = b.lim.Gate("sk-ok", "ok")
				cfg.Upstreams = map[string]executor.Upstream{"ok": up}
				cfg.TenantWeight = tenant.NewStore(b.pool, nil).Weight
				job := b.create(t, "ok")
				release := b.hold(t, `LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE`)
				return deliverJob(job.ID), failsOnTheStore, succeedsOnceReleased(b, release, job.ID)
			},
		},
		{
			// Redis holds no pause state (it lost its data): the pause kept in Postgres is
			// restored before anything is sent (credpause.Store.Restore).
			name: "PausesRestore",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				up := b.ok
				up.Gate = b.lim.Gate("sk-ok", "ok")
				cfg.Upstreams = map[string]executor.Upstream{"ok": up}
				cfg.Pauses = credpause.NewStore(b.pool, nil)
				job := b.create(t, "ok")
				release := b.hold(t, `LOCK TABLE credential_pauses IN ACCESS EXCLUSIVE MODE`)
				return deliverJob(job.ID), failsOnTheStore, succeedsOnceReleased(b, release, job.ID)
			},
		},
		{
			// A paused credential's probe got through: the pause ends in Postgres too
			// (credpause.Store.Resume). Its failure is logged; the answer is stored.
			name: "PausesResume",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				ctx := t.Context()
				up := b.ok
				up.Gate = b.lim.Gate("sk-ok", "ok")
				up.PauseProbeInterval = time.Nanosecond
				pauses := credpause.NewStore(b.pool, nil)
				_, err := pauses.Pause(ctx, up.Gate, "spend_cap", "earlier")
				require.NoError(t, err)
				cfg.Upstreams = map[string]executor.Upstream{"ok": up}
				cfg.Pauses = pauses
				job := b.create(t, "ok")
				b.hold(t, `SELECT 1 FROM credential_pauses WHERE tag = $1 FOR UPDATE`, up.Gate.Tag())
				return deliverJob(job.ID), func(t *testing.T, err error) {
					require.NoError(t, err)
					requireStatus(t, b, job.ID, jobs.StatusSucceeded)
				}, nil
			},
		},
		{
			// A spend-cap answer pauses its credential in Postgres too (credpause.Store.Pause,
			// which waits for the credential's pause lock). Its failure is logged; the dead
			// letter is stored, and the credential paused in Redis.
			name: "PausesPause",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				capped := executor.Upstream{Name: "capped", Kind: string(llm.KindAnthropic),
					Provider: simProvider(t, llmsim.Config{Faults: llmsim.Faults{SpendCap: true}}, "sk-capped"),
					Gate:     b.lim.Gate("sk-capped", "capped")}
				pauses := credpause.NewStore(b.pool, nil)
				// Redis knows the credential's pause state (resumed): no restore before the send.
				_, err := pauses.Pause(t.Context(), capped.Gate, "spend_cap", "earlier")
				require.NoError(t, err)
				_, err = pauses.Resume(t.Context(), capped.Gate)
				require.NoError(t, err)
				cfg.Upstreams = map[string]executor.Upstream{"capped": capped}
				cfg.Pauses = pauses
				job := b.create(t, "capped")
				release := b.hold(t, `SELECT pg_advisory_xact_lock($1, hashtext($2))`, int32(0x6c717073), capped.Gate.Tag())
				return deliverJob(job.ID), func(t *testing.T, err error) {
						require.NoError(t, err)
						requireStatus(t, b, job.ID, jobs.StatusDead)
					}, func(t *testing.T, _ *executor.Executor) {
						release()
						// Paused in Redis all the same (credpause's fallback has a bound of its own).
						ps, err := capped.Gate.Paused(t.Context())
						require.NoError(t, err)
						require.True(t, ps.Paused, "the spend cap paused the credential in Redis")
					}
			},
		},
		{
			// An attempt's start found the job not runnable (canceled since it was read): the
			// store reads why (jobs.Store.BeginAttempt's second statement, outside the batcher).
			name: "BeginAttemptFallback",
			arrange: func(t *testing.T, b *boundsBundle, cfg *executor.Config) (func(context.Context, *executor.Executor) error,
				func(*testing.T, error), func(*testing.T, *executor.Executor)) {
				cfg.Upstreams = map[string]executor.Upstream{"ok": b.ok}
				job := b.create(t, "ok")
				_, err := b.store.Cancel(t.Context(), job.ID)
				require.NoError(t, err)
				silenced := b.proxy.SilenceStatement("AND status = 'running' AND lease_until > clock_timestamp()")
				return func(ctx context.Context, ex *executor.Executor) error {
					// Handed over as created (dispatch.Handoff): the job is not read again.
					done := make(chan error, 1)
					go func() { done <- ex.ProcessFresh(ctx, job, nil) }()
					if !silenced(ctx) {
						return errors.New("the attempt start's second read was not sent")
					}
					return <-done
				}, failsOnTheStore, nil
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The delivery's own context lasts longer than the row's wait: without its bound, a
			// statement would wait for it (or for ever, detached from it).
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			b := newBoundsBundle(t)
			var cfg executor.Config
			deliver, check, after := tc.arrange(t, b, &cfg)
			cfg.Store, cfg.StoreTimeout = b.store, bound
			ex := executor.New(cfg)

			// When the delivery's statement waits on the lock, or a silent connection
			done := make(chan error, 1)
			go func() { done <- deliver(ctx, ex) }()

			// Then it ends soon after the bound, as it should
			select {
			case err := <-done:
				check(t, err)
			case <-time.After(15 * time.Second):
				t.Fatal("the delivery still waits past its statement's bound")
			}
			// And, the block lifted, the next delivery goes on
			if after != nil {
				after(t, ex)
			}
		})
	}
}

// deliverJob is a delivery of job id (executor.Executor.Process).
func deliverJob(id string) func(ctx context.Context, ex *executor.Executor) error {
	return func(ctx context.Context, ex *executor.Executor) error {
		return ex.Process(ctx, dispatch.Delivery{JobID: id})
	}
}

// succeedsOnceReleased is a row's check after its hold: released, job id's next delivery
// succeeds.
func succeedsOnceReleased(b *boundsBundle, release func(), id string) func(*testing.T, *executor.Executor) {
	return func(t *testing.T, ex *executor.Executor) {
		release()
		require.NoError(t, ex.Process(t.Context(), dispatch.Delivery{JobID: id}))
		requireStatus(t, b, id, jobs.StatusSucceeded)
	}
}

// defersOnceReleased is a row's check after its hold: released, job id's next delivery is
// deferred to the slot held in its row.
func defersOnceReleased(release func(), id string) func(*testing.T, *executor.Executor) {
	return func(t *testing.T, ex *executor.Executor) {
		release()
		var de *dispatch.DeferError
		require.ErrorAs(t, ex.Process(t.Context(), dispatch.Delivery{JobID: id}), &de, "the slot is held in the row")
	}
}

// requireStatus asserts the stored status of job id.
func requireStatus(t *testing.T, b *boundsBundle, id string, want jobs.Status) {
	t.Helper()
	got, err := b.store.Get(t.Context(), id)
	require.NoError(t, err)
	require.Equal(t, want, got.Status, "%+v", got.LastError)
}
