package executor

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestOutcome_LeasedDeferralKeepsTheHoldersRetryDelay: a duplicate delivery that found the job
// leased defers for at most leaseRecheck; when the lease holder records a retry with a long delay
// (a 30 s Retry-After) between that read and the deferral's answer, the row keeps the holder's
// time. Writing the deferral's time there (jobs.Store.Postpone, which applies once the lease is
// released) brought the next attempt back to ~2 s, against the provider's Retry-After; while the
// lease is live the write matched nothing, so it was a Postgres write for nothing.
func TestOutcome_LeasedDeferralKeepsTheHoldersRetryDelay(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	store := jobs.NewStore(pgtest.Pool(t), nil)
	job, _, err := store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "c",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)
	held, err := store.BeginAttempt(ctx, job.ID)
	require.NoError(t, err)
	e := New(Config{Store: store})

	// The duplicate delivery reads the job leased: its deferral.
	now := time.Now()
	df := leasedDefer(now, *held.LeaseUntil)
	// Then the holder records a retry 30 s out and releases its lease.
	retryAt := now.Add(30 * time.Second).Truncate(time.Microsecond)
	applied, err := store.Finish(ctx, job.ID, &jobs.Attempt{Number: 1, Credential: "c", StartedAt: now, StatusCode: 429,
		Class: "rate_limited", LeaseToken: *held.LeaseToken}, jobs.Outcome{Status: jobs.StatusRetrying, NextAttemptAt: &retryAt})
	require.NoError(t, err)
	require.True(t, applied)

	// The duplicate's deferral answers.
	var de *dispatch.DeferError
	require.True(t, errors.As(e.outcome(ctx, job.ID, df), &de))
	got, err := store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.NotNil(t, got.NextAttemptAt)
	require.True(t, got.NextAttemptAt.Equal(retryAt), "the holder's retry delay is kept: next attempt at %s, want %s",
		got.NextAttemptAt.Format(time.RFC3339Nano), retryAt.Format(time.RFC3339Nano))
}
