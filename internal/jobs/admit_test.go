package jobs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// admitParams is a new job whose CreateParams.Admit answers begin and records each job it is
// asked about in asked.
func admitParams(key string, begin *jobs.Begin, asked *[]jobs.Job) jobs.CreateParams {
	return jobs.CreateParams{Tenant: "default", Credential: "c", IdempotencyKey: key, Fingerprint: "f",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour,
		Admit: func(_ context.Context, job *jobs.Job) *jobs.Begin {
			*asked = append(*asked, *job)
			return begin
		}}
}

// A job whose first attempt was admitted before its insert (CreateParams.Admit answering a
// Begin) is created running in the one statement: its attempt counted, its lease the Begin's,
// its "queued" and "running" events in order; a delivery that comes for it meanwhile finds the
// lease. Admit is asked once, with the job as it will be inserted; with a Begin of nil the job
// is created queued, as without Admit. Both with and without an idempotency key.
func TestCreate_AdmitStartsTheFirstAttempt(t *testing.T) {
	t.Parallel()
	for name, key := range map[string]string{"NoKey": "", "Key": "k"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := jobstest.New(t)
			begin := &jobs.Begin{LeaseToken: uuid.NewString()}
			var asked []jobs.Job
			job, replayed, err := b.Store.Create(ctx, admitParams(key, begin, &asked))
			require.NoError(t, err)
			require.False(t, replayed)
			require.Len(t, asked, 1)
			require.Equal(t, job.ID, asked[0].ID, "asked under the job's ID")
			require.Equal(t, jobs.StatusQueued, asked[0].Status)
			require.JSONEq(t, `{"model":"m"}`, string(asked[0].Request))

			require.Equal(t, jobs.StatusRunning, job.Status)
			require.Equal(t, 1, job.Attempts)
			require.Equal(t, 2, job.EventSeq)
			require.NotNil(t, job.StartedAt)
			require.Equal(t, begin.LeaseToken, *job.LeaseToken)
			require.True(t, job.Leased(time.Now()))
			events, err := b.Store.Events(ctx, job.ID, 0)
			require.NoError(t, err)
			require.Len(t, events, 2)
			require.Equal(t, []int{1, 2}, []int{events[0].Seq, events[1].Seq})
			require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusRunning}, []jobs.Status{events[0].Type, events[1].Type})
			_, err = b.Store.BeginAttempt(ctx, job.ID)
			var leased *jobs.LeasedError
			require.ErrorAs(t, err, &leased, "the insert's lease holds the job")

			// Not due: created queued.
			var later []jobs.Job
			p := admitParams(key, nil, &later)
			if key != "" {
				p.IdempotencyKey = "k2"
			}
			queued, _, err := b.Store.Create(ctx, p)
			require.NoError(t, err)
			require.Len(t, later, 1)
			require.Equal(t, jobs.StatusQueued, queued.Status)
			require.Zero(t, queued.Attempts)
			require.Nil(t, queued.LeaseToken)
			events, err = b.Store.Events(ctx, queued.ID, 0)
			require.NoError(t, err)
			require.Len(t, events, 1)
		})
	}
}

// A replay (the idempotency key used before by the same body) is not a new job: Admit is not
// asked, so no rate slot is taken for it.
func TestCreate_ReplayAsksNoAdmission(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := jobstest.New(t)
	var asked []jobs.Job
	first, _, err := b.Store.Create(ctx, admitParams("k", nil, &asked))
	require.NoError(t, err)
	require.Len(t, asked, 1)
	again, replayed, err := b.Store.Create(ctx, admitParams("k", &jobs.Begin{LeaseToken: uuid.NewString()}, &asked))
	require.NoError(t, err)
	require.True(t, replayed)
	require.Equal(t, first.ID, again.ID)
	require.Len(t, asked, 1, "a replay asks nothing")
	require.Equal(t, jobs.StatusQueued, again.Status, "and starts nothing")
}
