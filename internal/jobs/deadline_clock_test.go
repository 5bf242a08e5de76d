package jobs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/clocktest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_DeadlineOnPostgresClock: a job's deadline is its timeout from Postgres's clock, the
// one its created_at is on, whatever the submitting host's clock says: an API host an hour ahead
// made a 10-minute job live 70 minutes (and one behind, ended it before it began).
func TestStore_DeadlineOnPostgresClock(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ahead := clocktest.New(time.Now().Add(time.Hour))
	store := jobs.NewStore(b.Pool, ahead.Now)
	job, _, err := store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: []byte(`{"model":"m"}`), MaxAttempts: 1, Timeout: 10 * time.Minute})
	require.NoError(t, err)
	var life time.Duration
	require.NoError(t, b.Pool.QueryRow(t.Context(),
		`SELECT extract(epoch FROM deadline - created_at) * 1e9 FROM jobs WHERE id = $1`, job.ID).Scan(&life))
	require.InDelta(t, float64(10*time.Minute), float64(life), float64(5*time.Second), "deadline - created_at on Postgres's clock")
	got, err := store.Get(t.Context(), job.ID)
	require.NoError(t, err)
	require.Equal(t, got.Deadline, job.Deadline, "Create answers the row's deadline")
}

// TestStore_RetryDeadDeadlineOnPostgresClock: a dead job retried (the console's Retry, on an API
// host; ctl dead retry) gets its fresh deadline from Postgres's clock too, as a new job does: a
// retrying host an hour ahead made a 10-minute job live 70 minutes, one an hour behind had the
// deadline pass fail it at once, without an attempt.
func TestStore_RetryDeadDeadlineOnPostgresClock(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	for _, skew := range []time.Duration{time.Hour, -time.Hour} {
		job := b.Dead(t, jobstest.Opts{Timeout: 10 * time.Minute}, jobs.ReasonRetriesExhausted, 1)
		store := jobs.NewStore(b.Pool, clocktest.New(time.Now().Add(skew)).Now)
		got, err := store.RetryDead(t.Context(), jobs.DeadFilter{IDs: []string{job.ID}}, nil)
		require.NoError(t, err)
		require.Len(t, got, 1)
		var left time.Duration
		require.NoError(t, b.Pool.QueryRow(t.Context(),
			`SELECT extract(epoch FROM deadline - clock_timestamp()) * 1e9 FROM jobs WHERE id = $1`, job.ID).Scan(&left))
		require.InDelta(t, float64(10*time.Minute), float64(left), float64(5*time.Second),
			"a retry by a host %s off: the deadline is 10 minutes from Postgres's clock", skew)
	}
}
