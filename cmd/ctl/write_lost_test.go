package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
	"github.com/llmq/llmq/internal/tenant"
)

// TestCtl_WriteLostSaysMayHaveBeenApplied: a command whose one statement that writes, sent
// outside a transaction (autocommit: it commits as it ends), got no answer (its connection
// failed once Postgres had applied it, or --timeout cut it) may have changed what it was to
// change: ctl says so and names the command to check, as for a COMMIT that got no answer. It
// said only the driver's error ("unexpected EOF"), or that --timeout fired, as if the command had
// changed nothing.
func TestCtl_WriteLostSaysMayHaveBeenApplied(t *testing.T) {
	t.Parallel()
	const lost = "postgres did not answer a statement that writes, its connection failed or the command was interrupted: " +
		"what it changed may have been applied; check with a list or show command"

	t.Run("TenantsSet", func(t *testing.T) {
		t.Parallel()
		b, store := acme(t)
		r := runBreakingWrite(t, b.url, "UPDATE tenants SET weight", loseAnswer, "tenants", "set", "acme", "--weight", "3")
		requireOneLineError(t, r, 1, lost+" (ctl tenants list)")
		w, err := store.Weight(t.Context(), "acme")
		require.NoError(t, err)
		require.Equal(t, 3, w, "applied, its answer lost")
	})
	t.Run("JobsCancel", func(t *testing.T) {
		t.Parallel()
		b := setupJobs(t)
		job := b.createJob(t)
		redis, _, _ := redisArgs(t)
		r := runBreakingWrite(t, b.url, "UPDATE jobs SET status = 'canceled'", loseAnswer,
			append(redis, "jobs", "cancel", job.ID)...)
		requireOneLineError(t, r, 1, lost+" (ctl jobs show ID)")
		got, err := b.store.Get(t.Context(), job.ID)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status, "applied, its answer lost")
	})
	t.Run("TimeoutCut", func(t *testing.T) {
		t.Parallel()
		b, _ := acme(t)
		r := runBreakingWrite(t, b.url, "UPDATE tenants SET weight", silence, "--timeout", "1s", "tenants", "set", "acme", "--weight", "3")
		requireOneLineError(t, r, 1, "postgres did not answer within 1s, --timeout, to a statement that writes: "+
			"what it changed may have been applied; check with a list or show command (ctl tenants list)")
	})
}

// TestWrites: what the tracer takes for a statement that writes.
func TestWrites(t *testing.T) {
	t.Parallel()
	for sql, want := range map[string]bool{
		"WITH live AS (SELECT id FROM jobs WHERE id = $1 FOR UPDATE), c AS (UPDATE jobs SET status = 'canceled' FROM live) SELECT 1": true,
		`UPDATE tenants SET weight = $2 WHERE name = $1`:             true,
		`INSERT INTO audit_log (operator) VALUES ($1)`:               true,
		`WITH d AS (DELETE FROM jobs RETURNING id) SELECT id FROM d`: true,
		`SELECT id, updated_at FROM jobs WHERE id = $1`:              false,
		`SELECT id FROM jobs WHERE id = $1 FOR UPDATE SKIP LOCKED`:   false,
		`SELECT id FROM jobs FOR NO KEY UPDATE`:                      false,
		`-- ping`:                                                    false,
		`begin`:                                                      false,
	} {
		require.Equal(t, want, writes(sql), sql)
	}
}

// acme is a jobs database holding the tenant acme, with the tenant store.
func acme(t *testing.T) (*jobsBundle, *tenant.Store) {
	t.Helper()
	b := setupJobs(t)
	store := tenant.NewStore(b.pool, nil)
	_, _, err := store.Create(t.Context(), "acme", nil)
	require.NoError(t, err)
	return b, store
}

// loseAnswer has Postgres run the held statement and its answer dropped, the connection cut.
func loseAnswer(_ context.Context, proxy *pgtest.Proxy, hold *pgtest.Hold) bool {
	proxy.LoseNextAnswer()
	hold.Release()
	return true
}

// silence sends the held statement on a connection that never answers again.
func silence(_ context.Context, proxy *pgtest.Proxy, hold *pgtest.Hold) bool {
	proxy.Freeze()
	hold.Release()
	return true
}

// runBreakingWrite runs ctl with args against the database at dbURL through a proxy that holds
// the first statement whose SQL contains substr, has breakIt break it, and returns what ctl said.
func runBreakingWrite(t *testing.T, dbURL, substr string, breakIt func(context.Context, *pgtest.Proxy, *pgtest.Hold) bool, args ...string) result {
	t.Helper()
	proxy, proxied := pgtest.NewProxy(t, dbURL)
	hold := proxy.HoldStatement(substr)
	defer hold.Release()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		r, _ := runTimeout(20*time.Second, append([]string{"--database-url", proxied}, args...)...)
		done <- r
	}()
	select {
	case <-hold.Reached():
	case r := <-done:
		t.Fatalf("the statement was not sent: %+v", r)
	case <-ctx.Done():
		t.Fatal("the statement was not sent")
	}
	require.True(t, breakIt(ctx, proxy, hold))
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		t.Fatal("ctl did not end")
		return result{}
	}
}
