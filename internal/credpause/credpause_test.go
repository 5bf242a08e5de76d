package credpause_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/credpause"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/redistest"
)

var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

type testBundle struct {
	store  *credpause.Store
	pool   *pgxpool.Pool // the store's
	gate   *limiter.Gate
	prefix string
	clock  *clocktest.Clock
	// lose removes every key of the test's Redis namespace, as a restart without persistence or
	// a FLUSHALL would.
	lose func()
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	clock := clocktest.New(t0)
	b := &testBundle{prefix: redistest.Prefix(t), clock: clock}
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: b.prefix, Now: clock.Now})
	require.NoError(t, err)
	b.pool = pgtest.Pool(t)
	b.store = credpause.NewStore(b.pool, clock.Now)
	b.gate = lim.Gate("sk-capped", "main")
	b.lose = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		redistest.Unlink(ctx, redistest.Client(t), b.prefix+"*")
	}
	return b
}

// TestStore_PauseSurvivesRedisLosingIt: a pause is kept in Postgres beside Redis; Restore writes
// it back into a Redis that lost it, the same episode, and a spend cap answered after the loss
// does not start a second episode (no second alert). Resume clears both, after which a loss
// restores "not paused".
func TestStore_PauseSurvivesRedisLosingIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()

	// Concurrent spend-cap answers: exactly one caller starts the episode.
	var starts atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			started, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-"+string(rune('a'+i)))
			if err != nil {
				t.Error(err)
			}
			if started {
				starts.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, starts.Load(), "exactly one caller starts the episode")
	kept, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, kept.Paused)
	inPG, err := b.store.Get(ctx, b.gate)
	require.NoError(t, err)
	require.Equal(t, kept.FirstJobID, inPG.FirstJobID)
	require.True(t, t0.Equal(inPG.Since))

	// Redis loses it: Restore brings back the episode.
	b.lose()
	st, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{Unknown: true}, st)
	ps, restored, err := b.store.Restore(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, restored)
	require.True(t, ps.Paused)
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
	require.Equal(t, kept.FirstJobID, st.FirstJobID)
	require.True(t, t0.Equal(st.Since))
	_, restored, err = b.store.Restore(ctx, b.gate)
	require.NoError(t, err)
	require.False(t, restored, "Redis holds the state: nothing to restore")

	// Lost again and answered by a spend cap before any restore: the episode goes on, unannounced.
	b.lose()
	started, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-after-the-loss")
	require.NoError(t, err)
	require.False(t, started, "the episode Postgres keeps goes on: no second alert")
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)

	// Resume ends it in both; a later loss restores "not paused".
	was, err := b.store.Resume(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, was)
	inPG, err = b.store.Get(ctx, b.gate)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, inPG)
	b.lose()
	ps, restored, err = b.store.Restore(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, restored)
	require.False(t, ps.Paused)
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)
	was, err = b.store.Resume(ctx, b.gate)
	require.NoError(t, err)
	require.False(t, was)

	// The next spend cap is a new episode.
	started, err = b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-next")
	require.NoError(t, err)
	require.True(t, started)
}

// TestStore_ResumeWinsOverARestoreReadBeforeIt: a Restore that read the pause from Postgres
// before a Resume, and writes it after, does not bring the pause back.
func TestStore_ResumeWinsOverARestoreReadBeforeIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	_, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	b.lose()
	stale, err := b.store.Get(ctx, b.gate) // the Restore's read
	require.NoError(t, err)
	require.True(t, stale.Paused)
	_, err = b.store.Resume(ctx, b.gate)
	require.NoError(t, err)
	restored, err := b.gate.RestorePause(ctx, stale) // the Restore's write
	require.NoError(t, err)
	require.False(t, restored)
	st, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)
}

// TestStore_PauseWithoutItsRowAlertsOnce: an episode Redis holds without its Postgres row (its
// insert failed, or it began before migration 020) alerted when it began; the next spend-cap
// answer on the credential (its pause probe's, say) writes the row but starts nothing, so it
// raises no second alert. A pause restored from the row between its insert and the Redis pause
// is still the episode that insert began.
func TestStore_PauseWithoutItsRowAlertsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()

	// Given an episode in Redis only (it alerted when it began),
	started, err := b.gate.Pause(ctx, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	require.True(t, started)
	// when the next spend cap answers, later, the row is written and the episode goes on unannounced.
	b.clock.Advance(10 * time.Minute)
	started, err = b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-probe")
	require.NoError(t, err)
	require.False(t, started, "a pause Redis held before its row was written alerted a second time")
	inPG, err := b.store.Get(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, inPG.Paused, "the episode is kept in Postgres from now on")

	// A row whose pause a restore wrote into Redis before the inserting call paused Redis: the
	// insert began the episode.
	_, err = b.store.Resume(ctx, b.gate)
	require.NoError(t, err)
	b.lose()
	_, err = b.gate.RestorePause(ctx, limiter.PauseState{Paused: true, Since: b.clock.Now(), Reason: "rate_limited_no_retry_after", FirstJobID: "job-2"})
	require.NoError(t, err)
	started, err = b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-2")
	require.NoError(t, err)
	require.True(t, started, "the call whose insert began the episode did not alert")
}

// TestStore_ConcurrentPausesKeepOneEpisode: concurrent spend-cap answers, with Redis on its own
// clock (as in production), start one episode: one caller alerts, and Redis holds the start and
// first job Postgres keeps, whichever caller reached Redis first, so that a restore after a
// loss brings back the same episode.
func TestStore_ConcurrentPausesKeepOneEpisode(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t)}) // Redis's clock
	require.NoError(t, err)
	gate := lim.Gate("sk-capped", "main")
	store := credpause.NewStore(pgtest.Pool(t), clocktest.New(t0).Now)

	var starts atomic.Int64
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			started, err := store.Pause(ctx, gate, "rate_limited_no_retry_after", "job-"+string(rune('a'+i)))
			if err != nil {
				t.Error(err)
			}
			if started {
				starts.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1, starts.Load(), "exactly one caller starts the episode")
	inRedis, err := gate.Paused(ctx)
	require.NoError(t, err)
	inPG, err := store.Get(ctx, gate)
	require.NoError(t, err)
	require.Equal(t, inPG.FirstJobID, inRedis.FirstJobID, "Redis and Postgres name different first jobs")
	require.True(t, inPG.Since.Equal(inRedis.Since), "Redis and Postgres date the episode differently: %s, %s",
		inRedis.Since, inPG.Since)
}

// TestStore_ResumeByTheLastRelease: during a rolling upgrade, the last release's ctl, console and
// pause probe resume a credential in Redis only (they delete the pause hash), leaving its row in
// Postgres. That resume holds: a new worker does not take it for a pause Redis lost and restore
// the row, and the credential's next spend cap is a new episode, which alerts (started) and
// replaces the row, in Redis as in Postgres, rather than the old episode coming back unannounced.
func TestStore_ResumeByTheLastRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	started, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	require.True(t, started)

	// ctl credentials resume, as the last release ran it.
	require.NoError(t, redistest.Client(t).Del(ctx, b.prefix+b.gate.Tag()+":pause").Err())

	st, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st, "resumed, not lost")
	_, restored, err := b.store.Restore(ctx, b.gate)
	require.NoError(t, err)
	require.False(t, restored, "the resume stays")
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.False(t, st.Paused)

	b.clock.Advance(time.Hour)
	started, err = b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-2")
	require.NoError(t, err)
	require.True(t, started, "a new episode: it alerts")
	inPG, err := b.store.Get(ctx, b.gate)
	require.NoError(t, err)
	require.Equal(t, "job-2", inPG.FirstJobID)
	require.True(t, t0.Add(time.Hour).Equal(inPG.Since))
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, inPG, st, "Redis holds the same episode")

	// Redis losing it now restores the new episode.
	b.lose()
	ps, restored, err := b.store.Restore(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, restored)
	require.Equal(t, "job-2", ps.FirstJobID)
}

// holdPause is a go-redis hook that holds the client's first pause script (limiter.Gate.Pause or
// PauseSince: a script on the pause hash and its flag, with arguments; a resume has none) until
// released: the moment between a Store.Pause's write to Postgres and its write to Redis.
type holdPause struct {
	once, releaseOnce sync.Once
	reached, released chan struct{}
}

// release lets the held script through (idempotent).
func (h *holdPause) release() { h.releaseOnce.Do(func() { close(h.released) }) }

func (h *holdPause) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdPause) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *holdPause) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(args) > 5 && fmt.Sprint(args[2]) == "2" {
			first := false
			h.once.Do(func() { first = true })
			if first {
				close(h.reached)
				select {
				case <-h.released:
				case <-time.After(30 * time.Second): // never forever, whatever the test does
				}
			}
		}
		return next(ctx, cmd)
	}
}

// waitingForLock returns a channel closed once a session of the test's database waits for a lock
// (polled until ctx ends).
func waitingForLock(ctx context.Context, pool *pgxpool.Pool) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		for {
			var waiting bool
			err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_database d ON d.oid = l.database
WHERE d.datname = current_database() AND NOT l.granted)`).Scan(&waiting)
			if err == nil && waiting {
				close(ch)
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return ch
}

// TestStore_PauseAndResumeAtOnce: a resume that comes while a pause has written Postgres but not
// yet Redis does not leave Redis paused with no row in Postgres (the console showing a pause that
// every operator's resume must end again, and that Redis losing its data would end by itself):
// the two are one after the other in both stores, and the resume, the later, holds.
func TestStore_PauseAndResumeAtOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	prefix := redistest.Prefix(t)
	pool := pgtest.Pool(t)
	store := credpause.NewStore(pool, nil)
	hook := &holdPause{reached: make(chan struct{}), released: make(chan struct{})}
	held := redistest.Client(t)
	held.AddHook(hook)
	t.Cleanup(hook.release) // a failed test leaves no pause held (before the client closes)
	pausing, err := limiter.New(held, &limiter.Config{Prefix: prefix})
	require.NoError(t, err)
	resuming, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: prefix})
	require.NoError(t, err)
	gate := resuming.Gate("sk-capped", "main")
	// Redis knows the credential is not paused (resumed before).
	_, err = gate.Resume(ctx)
	require.NoError(t, err)

	paused := make(chan error, 1)
	go func() {
		_, err := store.Pause(ctx, pausing.Gate("sk-capped", "main"), "rate_limited_no_retry_after", "job-1")
		paused <- err
	}()
	select {
	case <-hook.reached:
	case <-time.After(30 * time.Second):
		t.Fatal("the pause did not reach Redis")
	}
	// The pause has written Postgres, not Redis; an operator resumes (ctl: another process).
	resumed := make(chan error, 1)
	go func() {
		_, err := credpause.NewStore(pool, nil).Resume(ctx, gate)
		resumed <- err
	}()
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	resumeEnded := false
	select {
	case err := <-resumed: // the resume did not wait for the pause
		require.NoError(t, err)
		resumeEnded = true
	case <-waitingForLock(pollCtx, pool): // the resume waits for the pause to end
	case <-time.After(30 * time.Second):
		t.Fatal("the resume neither ended nor waited for the pause")
	}
	stopPolling()
	hook.release()
	select {
	case err := <-paused:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the pause did not end")
	}
	if !resumeEnded {
		select {
		case err := <-resumed:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the resume did not end")
		}
	}

	inRedis, err := gate.Paused(ctx)
	require.NoError(t, err)
	kept, err := store.Get(ctx, gate)
	require.NoError(t, err)
	require.False(t, kept.Paused, "the resume came last: Postgres keeps no pause")
	require.False(t, inRedis.Paused, "Redis is paused, Postgres is not: the console shows a pause no row keeps")
}

// TestStore_PausesWaitingForTheLockLeaveThePoolFree: a burst of spend-cap answers on one
// credential, while another process holds its pause lock (its pause waits on a slow Redis, say),
// does not take every connection of the worker's pool (16 for its 200 deliveries) to wait on the
// lock: one of the process's pauses waits on it, the others wait their turn without a connection,
// and the deliveries of every other credential still reach Postgres (leases renewed, results
// recorded).
func TestStore_PausesWaitingForTheLockLeaveThePoolFree(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := pgtest.URL(t)
	pcfg, err := pgxpool.ParseConfig(u)
	require.NoError(t, err)
	pcfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	other, err := pgxpool.New(ctx, u) // another process's, and the test's observer
	require.NoError(t, err)
	t.Cleanup(other.Close)
	lim, err := limiter.New(redistest.Client(t), &limiter.Config{Prefix: redistest.Prefix(t)})
	require.NoError(t, err)
	gate := lim.Gate("sk-capped", "main")
	store := credpause.NewStore(pool, nil)

	// Another process holds the credential's pause lock.
	holder, err := other.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	const lockClass = 0x6c717073 // credpause's
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockClass, gate.Tag())
	require.NoError(t, err)
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			_, err := holder.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1, hashtext($2))`, lockClass, gate.Tag())
			require.NoError(t, err)
		}
	}
	defer unlock()

	// Three spend-cap answers on the credential in this process.
	const pauses = 3
	done := make(chan error, pauses)
	for i := range pauses {
		go func() {
			_, err := store.Pause(ctx, gate, "rate_limited_no_retry_after", fmt.Sprintf("job-%d", i))
			done <- err
		}()
	}
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	select {
	case <-waitingForLock(pollCtx, other):
	case <-time.After(30 * time.Second):
		t.Fatal("no pause waits for the lock")
	}
	stopPolling()

	// Other work on the pool gets a connection.
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = pool.Exec(qctx, `SELECT 1`)
	require.NoError(t, err, "the pauses waiting for the lock hold every connection of the pool")

	unlock()
	for range pauses {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("a pause did not end once the lock was free")
		}
	}
	ps, err := store.Get(ctx, gate)
	require.NoError(t, err)
	require.True(t, ps.Paused)
}

// failover leaves Redis as a replica that had not received the credential's last pause holds
// it: the pause hash missing beside the known flag that an earlier resume (or restore) wrote.
// Redis's replication is asynchronous: a failover loses the writes of its last moments.
func (b *testBundle) failover(t *testing.T) {
	t.Helper()
	rdb := redistest.Client(t)
	key := b.prefix + b.gate.Tag() + ":pause"
	require.NoError(t, rdb.Del(t.Context(), key).Err())
	require.NoError(t, rdb.Set(t.Context(), key+":known", "1", 0).Err())
}

// TestStore_PauseLostByAFailover: a pause that Redis lost in a failover (its replica had the
// credential's earlier "not paused", not the pause) is one Postgres keeps: Reconcile writes it
// back, the same episode; and a spend cap answered before that goes on with the episode, with
// no second alert, as after a restart that lost every key. Before, Redis's "not paused" read as
// a resume: the credential was sent to until a spend cap paused it again, as a new episode
// that alerted a second time.
func TestStore_PauseLostByAFailover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	started, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	require.True(t, started)

	b.failover(t)
	st, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st, "Redis holds the credential as not paused")
	restored, err := b.store.Reconcile(ctx, b.gate)
	require.NoError(t, err)
	require.True(t, restored)
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.True(t, st.Paused)
	require.Equal(t, "job-1", st.FirstJobID)
	require.True(t, t0.Equal(st.Since))
	restored, err = b.store.Reconcile(ctx, b.gate)
	require.NoError(t, err)
	require.False(t, restored, "Redis holds the pause: nothing to restore")

	// Lost again and answered by a spend cap before any reconcile: the episode goes on.
	b.failover(t)
	b.clock.Advance(time.Minute)
	started, err = b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-after-the-failover")
	require.NoError(t, err)
	require.False(t, started, "the episode Postgres keeps goes on: no second alert")
	inPG, err := b.store.Get(ctx, b.gate)
	require.NoError(t, err)
	require.Equal(t, "job-1", inPG.FirstJobID)
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, inPG, st, "Redis holds the episode Postgres keeps")

	// A resume ends it: a reconcile, read before it or after, brings nothing back.
	_, err = b.store.Resume(ctx, b.gate)
	require.NoError(t, err)
	restored, err = b.store.Reconcile(ctx, b.gate)
	require.NoError(t, err)
	require.False(t, restored)
	st, err = b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)
}

// TestStore_ReconcileKeepsAResumeByTheLastRelease: a resume in Redis alone (the last release's,
// see TestStore_ResumeByTheLastRelease) of an episode Redis held is no failover's loss: the
// reconcile leaves it.
func TestStore_ReconcileKeepsAResumeByTheLastRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	_, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	require.NoError(t, redistest.Client(t).Del(ctx, b.prefix+b.gate.Tag()+":pause").Err())
	restored, err := b.store.Reconcile(ctx, b.gate)
	require.NoError(t, err)
	require.False(t, restored, "the resume stays")
	st, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)
}

// TestStore_ReconcileRacingAResume: a reconcile that read the credential's row before a resume
// (of any process) deleted it does not write the ended episode back into Redis: it reads the row
// again under the credential's pause lock, which the resume holds from its delete to its Redis
// write.
func TestStore_ReconcileRacingAResume(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	_, err := b.store.Pause(ctx, b.gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	b.failover(t)

	// Another process's resume holds the credential's pause lock.
	holder, err := b.pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	const lockClass = 0x6c717073 // credpause's
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1, hashtext($2))`, lockClass, b.gate.Tag())
	require.NoError(t, err)

	done := make(chan error, 1)
	var restored bool
	go func() {
		var err error
		restored, err = b.store.Reconcile(ctx, b.gate)
		done <- err
	}()
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	select {
	case <-waitingForLock(pollCtx, b.pool):
	case <-time.After(30 * time.Second):
		t.Fatal("the reconcile never waited for the lock: it did not read the row first")
	}
	stopPolling()

	// The resume, under the lock: the row first, then Redis.
	_, err = holder.Exec(ctx, `DELETE FROM credential_pauses WHERE tag = $1`, b.gate.Tag())
	require.NoError(t, err)
	_, err = b.gate.Resume(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1, hashtext($2))`, lockClass, b.gate.Tag())
	require.NoError(t, err)

	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the reconcile did not end once the lock was free")
	}
	require.False(t, restored, "the resume holds")
	st, err := b.gate.Paused(ctx)
	require.NoError(t, err)
	require.Equal(t, limiter.PauseState{}, st)
}
