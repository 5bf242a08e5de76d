// Package jobstest gives tests a job store on a database of their own (pgtest), and the jobs in
// it that a test needs: queued, attempted, dead, or with an attempt lease that has run out. For
// tests only.
package jobstest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// Bundle is a fresh migrated database with a store on it.
type Bundle struct {
	URL   string
	Pool  *pgxpool.Pool
	Store *jobs.Store
}

// New returns a Bundle on a database that is dropped when the test ends.
func New(t *testing.T) *Bundle {
	t.Helper()
	u := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &Bundle{URL: u, Pool: pool, Store: jobs.NewStore(pool, nil)}
}

// Opts shape a job made by Create. Zero fields take the defaults.
type Opts struct {
	// Credential is the job's credential. Default "default".
	Credential string
	// Timeout is the job's timeout. Default a minute.
	Timeout time.Duration
	// Priority is the job's priority. Default normal.
	Priority jobs.Priority
	// Tenant is the job's tenant. Default "default".
	Tenant string
	// Request is the provider request. Default {"model":"m"}.
	Request json.RawMessage
	// Fallbacks are the job's fallback credentials. Default none.
	Fallbacks []string
}

// Create commits a queued job with 3 attempts (see Opts for the defaults).
func (b *Bundle) Create(t *testing.T, o Opts) *jobs.Job {
	t.Helper()
	if o.Credential == "" {
		o.Credential = "default"
	}
	if o.Tenant == "" {
		o.Tenant = "default"
	}
	if o.Request == nil {
		o.Request = json.RawMessage(`{"model":"m"}`)
	}
	if o.Timeout == 0 {
		o.Timeout = time.Minute
	}
	job, _, err := b.Store.Create(context.Background(), jobs.CreateParams{
		Tenant: o.Tenant, Credential: o.Credential, Fallbacks: o.Fallbacks, Fingerprint: "fp",
		Request: o.Request, MaxAttempts: 3, Timeout: o.Timeout, Priority: o.Priority,
	})
	require.NoError(t, err)
	return job
}

// Attempt runs one attempt of the job as the worker records it (numbered by jobs.attempts) and
// moves the job to o (a failed attempt's LastError defaults to a 503).
func (b *Bundle) Attempt(t *testing.T, id string, o jobs.Outcome) {
	t.Helper()
	ctx := context.Background()
	job, err := b.Store.BeginAttempt(ctx, id)
	require.NoError(t, err)
	if o.LastError == nil && o.Status != jobs.StatusSucceeded {
		o.LastError = &jobs.LastError{Class: "retryable", Status: 503, Message: "overloaded"}
	}
	code := 503
	if o.Status == jobs.StatusSucceeded {
		code = 200
	}
	applied, err := b.Store.Finish(ctx, id, &jobs.Attempt{
		Number: job.Attempts, Credential: job.CurrentCredential(), StartedAt: time.Now(), Latency: 25 * time.Millisecond,
		StatusCode: code, Class: "retryable",
	}, o)
	require.NoError(t, err)
	require.True(t, applied)
}

// Dead makes a job that died with reason after n attempts.
func (b *Bundle) Dead(t *testing.T, o Opts, reason string, n int) *jobs.Job {
	t.Helper()
	job := b.Create(t, o)
	for range n - 1 {
		b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	}
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: reason})
	return job
}

// Events returns the types of the job's stored events, in order.
func (b *Bundle) Events(t *testing.T, id string) []jobs.Status {
	t.Helper()
	evs, err := b.Store.Events(context.Background(), id, 0)
	require.NoError(t, err)
	out := make([]jobs.Status, len(evs))
	for i, e := range evs {
		require.Equal(t, i+1, e.Seq)
		out[i] = e.Type
	}
	return out
}

// ExpireLease ends job id's attempt lease as if its delivery had died.
func (b *Bundle) ExpireLease(t *testing.T, id string) {
	t.Helper()
	_, err := b.Pool.Exec(t.Context(), `UPDATE jobs SET lease_until = now() - interval '1 second' WHERE id = $1`, id)
	require.NoError(t, err)
}

// Finished commits a job of tenant "default" that ended in status, with idempotency key key
// ("": none), an event watch, its events, and one attempt (none when canceled). It returns the
// job's ID.
func (b *Bundle) Finished(t *testing.T, status jobs.Status, key string) string {
	t.Helper()
	ctx := t.Context()
	job, _, err := b.Store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", IdempotencyKey: key,
		Fingerprint: "fp-" + key, Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 1, Timeout: time.Minute})
	require.NoError(t, err)
	require.NoError(t, b.Store.Watch(ctx, job.ID, time.Minute))
	switch status {
	case jobs.StatusCanceled:
		_, err := b.Store.Cancel(ctx, job.ID)
		require.NoError(t, err)
	case jobs.StatusDead:
		b.Attempt(t, job.ID, jobs.Outcome{Status: status, DeadReason: jobs.ReasonRetriesExhausted})
	default:
		b.Attempt(t, job.ID, jobs.Outcome{Status: status})
	}
	return job.ID
}

// FinishedAgo moves job id's end d into the past.
func (b *Bundle) FinishedAgo(t *testing.T, id string, d time.Duration) {
	t.Helper()
	_, err := b.Pool.Exec(t.Context(), `UPDATE jobs SET finished_at = now() - $2 * interval '1 millisecond' WHERE id = $1`,
		id, d.Milliseconds())
	require.NoError(t, err)
}

// Rows counts job id's rows in jobs and in each table that hangs off it: job_attempts,
// job_events, job_watches and idempotency_keys.
func (b *Bundle) Rows(t *testing.T, id string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, table := range []string{"jobs", "job_attempts", "job_events", "job_watches", "idempotency_keys"} {
		col := "job_id"
		if table == "jobs" {
			col = "id"
		}
		var n int
		require.NoError(t, b.Pool.QueryRow(t.Context(), `SELECT count(*) FROM `+table+` WHERE `+col+` = $1`, id).Scan(&n))
		out[table] = n
	}
	return out
}
