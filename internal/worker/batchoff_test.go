package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/redistest"
	"github.com/llmq/llmq/internal/worker"
)

// TestWorker_LastBatchLaneTurnedOffStillDrains: a config that turns off the batch lane of the
// last credential that had one still sends the jobs waiting for a batch online (and polls the
// batches sent), as turning off one lane among others does; before, such a worker built no
// batch lane at all, and the jobs waited for their deadline to fail them.
func TestWorker_LastBatchLaneTurnedOffStillDrains(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	queue := redistest.Queue(t, redistest.URL())
	cfg, pool := testConfig(t, redistest.URL(), "queue: "+queue+", ") // no batch lane enabled
	// Given a job that a worker of the previous config left waiting for a batch,
	job, _, err := jobs.NewStore(pool, nil).Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default",
		Lane: jobs.LaneBatch, Request: json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`),
		MaxAttempts: 3, Timeout: 24 * time.Hour})
	require.NoError(t, err)
	// when a worker of the new config runs,
	b := &testBundle{cfg: cfg, prefix: redistest.Prefix(t)}
	b.w, err = worker.New(context.Background(), cfg, pool, worker.Options{RedisPrefix: b.prefix})
	require.NoError(t, err)
	b.run(t)
	// then the job goes online, told why.
	var lane, state string
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT lane, coalesce(batch_state, '') FROM jobs WHERE id = $1`, job.ID).Scan(&lane, &state)
		return err == nil && lane == string(jobs.LaneOnline)
	}, 20*time.Second, 50*time.Millisecond, "the job still waits for a batch")
	require.Equal(t, "lane_off", state)
}

// TestWorker_RemovedCredentialsBatchJobsGoOnline: a job waiting for a batch on a credential the
// config no longer has goes online, as a job of a lane turned off does, and there fails over to
// its fallbacks (or is dead-lettered, naming the credential: see
// TestWorker_RemovedCredentialsBatchJobWithoutFallbackIsDead) as an online job on a removed
// credential does; before, no lane collected it and it waited for its deadline (a day, by
// default) to be failed for it.
func TestWorker_RemovedCredentialsBatchJobsGoOnline(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, job := runWithRemovedCredentialsBatchJob(t, []string{"backup"})
	// then the job goes online, and on to its fallback.
	var lane, state string
	var index int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT lane, coalesce(batch_state, ''), credential_index FROM jobs WHERE id = $1`, job.ID).
			Scan(&lane, &state, &index)
		return err == nil && lane == string(jobs.LaneOnline) && index == 1
	}, 20*time.Second, 50*time.Millisecond, "the job still waits for a batch on a credential no longer configured")
	require.Equal(t, "lane_off", state)
}

// TestWorker_RemovedCredentialsBatchJobWithoutFallbackIsDead: a job waiting for a batch on a
// credential the config no longer has, with no fallback, goes online and there is
// dead-lettered (credential_not_configured) as an online job on a removed credential is, so that
// a retry runs it once the credential is back. It was failed.
func TestWorker_RemovedCredentialsBatchJobWithoutFallbackIsDead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, job := runWithRemovedCredentialsBatchJob(t, nil)
	// then the job goes online, and is a dead letter naming the credential.
	var status, reason, state string
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT status, coalesce(dead_reason, ''), coalesce(batch_state, '') FROM jobs WHERE id = $1`,
			job.ID).Scan(&status, &reason, &state)
		return err == nil && jobs.Status(status).Terminal()
	}, 20*time.Second, 50*time.Millisecond, "the job did not end")
	require.Equal(t, string(jobs.StatusDead), status)
	require.Equal(t, jobs.ReasonCredentialNotConfigured, reason)
	require.Equal(t, "lane_off", state)
}

// runWithRemovedCredentialsBatchJob creates a job waiting for a batch on "gone", a credential
// the test config does not have, with fallbacks, then runs a worker of that config until the
// test ends. It returns the worker's pool and the job.
func runWithRemovedCredentialsBatchJob(t *testing.T, fallbacks []string) (*pgxpool.Pool, *jobs.Job) {
	t.Helper()
	queue := redistest.Queue(t, redistest.URL())
	cfg, pool := testConfig(t, redistest.URL(), "queue: "+queue+", ")
	// Given a job waiting for a batch on "gone", a credential this config no longer has,
	job, _, err := jobs.NewStore(pool, nil).Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "gone",
		Fallbacks: fallbacks, Lane: jobs.LaneBatch,
		Request:     json.RawMessage(`{"model":"claude-test","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`),
		MaxAttempts: 1, Timeout: 24 * time.Hour})
	require.NoError(t, err)
	// when a worker of that config runs,
	b := &testBundle{cfg: cfg, prefix: redistest.Prefix(t)}
	b.w, err = worker.New(context.Background(), cfg, pool, worker.Options{RedisPrefix: b.prefix})
	require.NoError(t, err)
	b.run(t)
	return pool, job
}
