package console_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/console"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestJobCancel_StalledStatementIsA503: an operator's cancel of a job whose row a long
// transaction holds locked (an I/O stall or a failover alike) is answered 503 unavailable at
// Config.ActionTimeout, as the API's DELETE is at api.store_timeout, and nothing of it lands once
// the lock is let go. It waited as long as the browser did, holding a connection of the pool the
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

	require.NoError(t, tx.Rollback(ctx))
	j, err := b.jobs.Store.Get(ctx, queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, j.Status, "the refused cancel did not land")
	res, out = doWithin(t, c, http.MethodPost, "/console/api/jobs/"+queued.ID+"/cancel", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, out)
}
