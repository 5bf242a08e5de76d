package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestJobCancel_StalledStatementIsA503: an operator's cancel of a job whose row a long
// transaction holds locked (an I/O stall or a failover alike) is answered 503 unavailable at
// Config.ActionTimeout, as the API's DELETE is at api.store_timeout, and nothing of it lands once
// the lock is let go (after pgx's cancel of the statement, sent as the answer goes, reached
// Postgres). It waited as long as the browser did, holding a connection of the pool the
// API's requests share; each click on the button one more.
func TestJobCancel_StalledStatementIsA503(t *testing.T) {
	t.Parallel()
	b := setupConfig(t, func(cfg *console.Config) { cfg.ActionTimeout = 3 * time.Second }) // the cancel after the lock, on a loaded machine
	c := b.login(t)
	ctx := context.Background()
	queued := b.jobs.Create(t, jobstest.Opts{})

	tx, err := b.jobs.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, queued.ID)
	require.NoError(t, err)

	res, out := doWithin(t, c, http.MethodPost, "/console/api/jobs/"+queued.ID+"/cancel", nil)
	requireError(t, res, out, http.StatusServiceUnavailable, "unavailable")
	// Postgres was there, and slow: the answer says so, not that it is unreachable (which sent
	// an operator looking for a network fault).
	msg := errorMessage(t, out)
	require.Contains(t, msg, "did not answer in time")
	require.NotContains(t, msg, "unreachable")

	// pgx cancels the abandoned statement as the answer goes (its cancel request on a connection
	// of its own, then it closes the statement's): let go of the lock once Postgres has it, or a
	// loaded machine lets the statement take the lock first and cancel the job after its 503.
	pgtest.LockWaitersGone(t, b.jobs.Pool, "the abandoned cancel")
	require.NoError(t, tx.Rollback(ctx))
	j, err := b.jobs.Store.Get(ctx, queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, j.Status, "the refused cancel did not land")
	res, out = doWithin(t, c, http.MethodPost, "/console/api/jobs/"+queued.ID+"/cancel", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, out)
}

// errorMessage is the message of the console's error answer body.
func errorMessage(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct{ Message string }
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	return e.Error.Message
}

// TestJobCancel_UnreachableDatabaseSaysSo: an action whose Postgres cannot be reached (here its
// proxy refuses connections) is answered 503 unavailable saying the database is unreachable,
// not that it was slow.
func TestJobCancel_UnreachableDatabaseSaysSo(t *testing.T) {
	t.Parallel()
	var proxy *pgtest.Proxy
	b := setupConfig(t, func(cfg *console.Config) {
		var proxied string
		proxy, proxied = pgtest.NewProxy(t, cfg.Pool.Config().ConnString())
		pool, err := pgxpool.New(context.Background(), proxied)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		cfg.Jobs = jobs.NewStore(pool, nil)
	})
	c := b.login(t)
	queued := b.jobs.Create(t, jobstest.Opts{})
	proxy.Cut()

	res, out := doWithin(t, c, http.MethodPost, "/console/api/jobs/"+queued.ID+"/cancel", nil)
	requireError(t, res, out, http.StatusServiceUnavailable, "unavailable")
	require.Contains(t, errorMessage(t, out), "unreachable")
}
