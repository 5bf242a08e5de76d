package executor_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/executor"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// A deferral's write (the job's next look, jobs.Store.Postpone) ran detached from the delivery
// and without any bound: on a connection left open and silent (a partition, a failover behind a
// moved address) the delivery never returned, not at its task's timeout nor at shutdown; its
// worker slot was lost, and the job's task stayed active on a live server, which the sweeper
// never rescues. A worker's statements outside the batcher are bounded by
// Config.StoreTimeout now: the delivery fails, and asynq delivers it again.
func TestExecutor_SilentConnectionDoesNotHoldADelivery(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	proxy, viaProxy := pgtest.NewProxy(t, pgtest.URL(t))
	pool, err := pgxpool.New(ctx, viaProxy+"&pool_max_conns=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// Before the pool's close, which waits for its connections: a statement still waiting on a
	// silent one ends with it.
	t.Cleanup(proxy.Cut)
	store := jobs.NewStore(pool, nil)
	ex := executor.New(executor.Config{Store: store, StoreTimeout: time.Second,
		Upstreams: map[string]executor.Upstream{"known": {Name: "known"}}})
	// A job on a credential a newer config's process knows: its delivery here defers it, and
	// writes the deferral's time to its row.
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "newer",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)

	// When the connection the deferral's write goes out on falls silent
	silenced := proxy.SilenceStatement("UPDATE jobs SET next_attempt_at = $2, updated_at = now()")
	done := make(chan error, 1)
	go func() { done <- ex.Process(t.Context(), dispatch.Delivery{JobID: job.ID}) }()
	require.True(t, silenced(ctx), "the deferral's write was not sent")

	// Then the delivery ends with the store's error (dispatch retries it), soon after the bound
	select {
	case err := <-done:
		require.Error(t, err)
		var deferred *dispatch.DeferError
		require.NotErrorAs(t, err, &deferred, "a deferral whose time was not stored")
	case <-time.After(20 * time.Second):
		t.Fatal("the delivery still waits on a silent connection")
	}
}
