package jobs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

func TestStore_Events(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := context.Background()
	job := b.Create(t, jobstest.Opts{})
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})

	t.Run("All", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, []jobs.Status{"queued", "running", "retrying", "running", "succeeded"}, b.Events(t, job.ID))
	})
	t.Run("After", func(t *testing.T) {
		t.Parallel()
		evs, err := b.Store.Events(ctx, job.ID, 3)
		require.NoError(t, err)
		require.Len(t, evs, 2)
		require.Equal(t, 4, evs[0].Seq)
		require.Equal(t, jobs.StatusSucceeded, evs[1].Type)
		require.JSONEq(t, `{}`, string(evs[1].Payload))
	})
	t.Run("UnknownAndMalformed", func(t *testing.T) {
		t.Parallel()
		for _, id := range []string{"0190a5b2-7c1e-7d3f-9a8b-123456789abc", "nope"} {
			evs, err := b.Store.Events(ctx, id, 0)
			require.NoError(t, err)
			require.Empty(t, evs)
		}
	})
}
