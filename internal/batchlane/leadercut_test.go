package batchlane_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// heldSubmit is a Client whose first Submit is held on its way to the provider until the test
// releases it. The provider then gets the batch whatever became of the caller's context (an HTTP
// request already sent when its context ended), and the caller hears of it only after.
type heldSubmit struct {
	batchlane.Client
	reached, release, done chan struct{}
	once                   sync.Once
}

func newHeldSubmit(c batchlane.Client) *heldSubmit {
	return &heldSubmit{Client: c, reached: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
}

func (h *heldSubmit) Submit(ctx context.Context, ref string, reqs []batchlane.Request,
	uploaded func(string) error) (string, error) {
	first := false
	h.once.Do(func() { first = true; close(h.reached) })
	if !first {
		return h.Client.Submit(ctx, ref, reqs, uploaded)
	}
	defer close(h.done)
	<-h.release
	id, err := h.Client.Submit(context.WithoutCancel(ctx), ref, reqs, uploaded)
	if err == nil && ctx.Err() != nil {
		return "", ctx.Err()
	}
	return id, err
}

// leaderTick is the leading batchers' Tick: their pass interval, and also the interval and the
// time bound of their lock's check (leader.Lead), so a check that takes longer cuts the leader
// off. At 10 ms, on a loaded machine, the leaders cut themselves off over and over, every pass
// canceled midway (for 10 s running, at load 20).
const leaderTick = 100 * time.Millisecond

// wait bounds each wait of the leader tests for something that takes a few ticks: the time
// after which it is not coming, not a measure of how long it takes.
const wait = 30 * time.Second

// leadingBatcher returns a batcher of the default credential on its own pool (a process of its
// own), through client, passing every leaderTick, and the registry of its metrics. It logs to
// the test's output as name (its lost locks and failed passes, read when the test fails).
func (b *testBundle) leadingBatcher(t *testing.T, name string, client batchlane.Client) (*batchlane.Batcher, *prometheus.Registry) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), b.pool.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reg := prometheus.NewRegistry()
	return batchlane.New(batchlane.Config{Pool: pool, Now: b.clock.Now, Metrics: batchlane.NewMetrics(reg, []string{"default"}),
		Tick:    leaderTick,
		Logger:  slog.New(slog.NewTextHandler(t.Output(), nil)).With("batcher", name),
		Lanes:   []batchlane.Lane{{Credential: "default", Client: client, Config: b.cfg}},
		Enqueue: func(context.Context, string, jobs.Priority) error { return nil }}), reg
}

// passed reports whether the batcher whose metrics reg holds has made a pass without error.
func passed(t *testing.T, reg *prometheus.Registry) bool {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == "llmq_batch_last_success_timestamp_seconds" {
			return f.GetMetric()[0].GetGauge().GetValue() > 0
		}
	}
	return false
}

// pastClaim moves the clock past the send claim, or a failed send's backoff, that holds the
// bundle's committed batches, if one does: time enough for any send of them to have ended.
func (b *testBundle) pastClaim(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var due *time.Time
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT max(next_poll_at) FROM provider_batches WHERE state = 'committed'`).Scan(&due))
	if due != nil && b.clock.Now().Before(*due) {
		b.clock.Set(due.Add(time.Second))
	}
}

// running reports whether every job of ids is running.
func (b *testBundle) running(ids ...string) bool {
	for _, id := range ids {
		if j, err := b.store.Get(context.Background(), id); err != nil || j.Status != jobs.StatusRunning {
			return false
		}
	}
	return true
}

// terminateBackends ends every session on the bundle's database but the one it uses to do so
// (a Postgres restart or failover, as its clients see it), and drops the bundle's own pool's
// connections so that the test's reads do not trip on them.
func (b *testBundle) terminateBackends(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, b.pool.Config().ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n))
	require.Positive(t, n)
	b.pool.Reset()
}

// TestBatcher_LeaderCutMidSendSendsOnce: the leader's lock connection is cut while its pass is
// sending a batch. Another process leads at once, while the old leader's send is still on its
// way to the provider (it learns of the lost lock only at its next check, and its request may
// have left already). The new leader must not send the batch a second time: each job is in one
// provider batch, paid for once, and the batch is adopted once the old send is over.
func TestBatcher_LeaderCutMidSendSendsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	j1, j2 := b.submit(t, "one", 0, 0), b.submit(t, "two", 0, 0)
	b.clock.Advance(fill)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	held := newHeldSubmit(b.client)
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(held.release) }) }
	// Registered after each batcher's pool, so that it runs before they close.
	stop := func() {
		cancel()
		release()
		wg.Wait()
	}
	old, _ := b.leadingBatcher(t, "old", held)
	t.Cleanup(stop)
	wg.Go(func() { _ = old.Run(ctx) })
	select {
	case <-held.reached:
	case <-time.After(wait):
		t.Fatal("the first leader did not send its batch")
	}

	// When the leader's connection is cut mid-send and another process leads
	b.terminateBackends(t)
	next, reg := b.leadingBatcher(t, "new", b.client)
	t.Cleanup(stop)
	wg.Go(func() { _ = next.Run(ctx) })
	require.Eventually(t, func() bool { return passed(t, reg) }, wait, 5*time.Millisecond,
		"the new leader makes a pass")
	// and the old leader's send reaches the provider
	release()
	select {
	case <-held.done:
	case <-time.After(wait):
		t.Fatal("the old leader's send did not end")
	}

	// Then the provider holds the batch once
	require.Equal(t, 1, b.sim.BatchStats().Created, "the provider holds exactly one batch")
	require.Equal(t, 2, b.sim.BatchStats().Requests, "each job sent once")

	// And the new leader adopts it once the claim has run out: its jobs run in it, one attempt
	// each. A leader's pass cut off after it began the send (its lock check did not answer in
	// time) claims the batch anew, as any cut-off send must: time is moved past whichever claim
	// stands until a pass has recorded the batch.
	deadline := time.After(wait)
	for !b.running(j1.ID, j2.ID) {
		b.pastClaim(t)
		select {
		case <-deadline:
			t.Fatal("the batch's jobs do not run")
		case <-time.After(5 * time.Millisecond):
		}
	}
	for _, id := range []string{j1.ID, j2.ID} {
		require.Equal(t, 1, b.get(t, id).Attempts)
	}
	require.Equal(t, 1, b.sim.BatchStats().Created, "the provider holds exactly one batch")
}
