package api

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestCancel_ReadsItsJobOnce: a cancel whose tenant has a place free reads its job once, in its
// one statement (jobs.Store.CancelOf), also for the answer to a cancel resent (it read the job
// again for that answer). It read the job first (a batched point read, to answer a
// job missing or ended without a place) and again under the lock: one statement more for every
// cancel. The first read is made only when the tenant's places are full
// (TestCancel_EndedJobTakesNoPlace).
func TestCancel_ReadsItsJobOnce(t *testing.T) {
	t.Parallel()
	queries := &queryCounter{}
	b := setup(t, setupOpts{noListener: true, queries: queries})
	for _, tc := range []struct {
		name   string
		status jobs.Status // "" leaves it queued
		code   int
	}{
		{"Queued", "", http.StatusOK},
		{"Dead", jobs.StatusDead, http.StatusOK},
		{"Succeeded", jobs.StatusSucceeded, http.StatusConflict},
		// A cancel resent (its answer lost): the job for its answer is the one read.
		{"Canceled", jobs.StatusCanceled, http.StatusOK},
	} {
		job := b.create(t, "")
		switch tc.status {
		case jobs.StatusDead:
			b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
		case jobs.StatusSucceeded:
			b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
		case jobs.StatusCanceled:
			_, err := b.store.Cancel(context.Background(), job.ID)
			require.NoError(t, err)
		}
		before := queries.n.Load()
		r := b.do(t, http.MethodDelete, "/v1/jobs/"+job.ID, "", nil)
		require.Equal(t, tc.code, r.status, "%s: %v", tc.name, r.body)
		require.Equal(t, int64(1), queries.n.Load()-before, "%s: reads of the job for one cancel", tc.name)
	}
}
