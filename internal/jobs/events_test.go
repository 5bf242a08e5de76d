package jobs_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

func TestStore_Events(t *testing.T) {
	t.Parallel()
	b := setupStore(t)
	ctx := context.Background()
	job := b.create(t, jobOpts{})
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded})

	t.Run("All", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, []jobs.Status{"queued", "running", "retrying", "running", "succeeded"}, b.events(t, job.ID))
	})
	t.Run("After", func(t *testing.T) {
		t.Parallel()
		evs, err := b.store.Events(ctx, job.ID, 3)
		require.NoError(t, err)
		require.Len(t, evs, 2)
		require.Equal(t, 4, evs[0].Seq)
		require.Equal(t, jobs.StatusSucceeded, evs[1].Type)
		require.JSONEq(t, `{}`, string(evs[1].Payload))
	})
	t.Run("UnknownAndMalformed", func(t *testing.T) {
		t.Parallel()
		for _, id := range []string{"0190a5b2-7c1e-7d3f-9a8b-123456789abc", "nope"} {
			evs, err := b.store.Events(ctx, id, 0)
			require.NoError(t, err)
			require.Empty(t, evs)
		}
	})
}
