package jobs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgxpool's background health check ends after the test's pool.Close.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// storeBundle is a fresh migrated database with a store on it.
type storeBundle struct {
	url   string
	pool  *pgxpool.Pool
	store *jobs.Store
}

func setupStore(t *testing.T) *storeBundle {
	t.Helper()
	u := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return &storeBundle{url: u, pool: pool, store: jobs.NewStore(pool, nil)}
}

type jobOpts struct {
	credential string
	timeout    time.Duration
}

func (b *storeBundle) create(t *testing.T, o jobOpts) *jobs.Job {
	t.Helper()
	if o.credential == "" {
		o.credential = "default"
	}
	if o.timeout == 0 {
		o.timeout = time.Minute
	}
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{
		Tenant: "default", Credential: o.credential, Fingerprint: "fp",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: o.timeout,
	})
	require.NoError(t, err)
	return job
}

// attempt runs one attempt of the job as the worker records it (numbered by jobs.attempts) and
// moves the job to o.
func (b *storeBundle) attempt(t *testing.T, id string, o jobs.Outcome) {
	t.Helper()
	ctx := context.Background()
	job, err := b.store.BeginAttempt(ctx, id)
	require.NoError(t, err)
	if o.LastError == nil && o.Status != jobs.StatusSucceeded {
		o.LastError = &jobs.LastError{Class: "server_error", Status: 503, Message: "overloaded"}
	}
	code := 503
	if o.Status == jobs.StatusSucceeded {
		code = 200
	}
	applied, err := b.store.Finish(ctx, id, &jobs.Attempt{
		Number: job.Attempts, Credential: job.Credential, StartedAt: time.Now(), Latency: 25 * time.Millisecond,
		StatusCode: code, Class: "server_error",
	}, o)
	require.NoError(t, err)
	require.True(t, applied)
}

// dead makes a job that died with reason after n attempts.
func (b *storeBundle) dead(t *testing.T, o jobOpts, reason string, n int) *jobs.Job {
	t.Helper()
	job := b.create(t, o)
	for range n - 1 {
		b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	}
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: reason})
	return job
}

// events returns the types of the job's stored events, in order.
func (b *storeBundle) events(t *testing.T, id string) []jobs.Status {
	t.Helper()
	evs, err := b.store.Events(context.Background(), id, 0)
	require.NoError(t, err)
	out := make([]jobs.Status, len(evs))
	for i, e := range evs {
		require.Equal(t, i+1, e.Seq)
		out[i] = e.Type
	}
	return out
}
