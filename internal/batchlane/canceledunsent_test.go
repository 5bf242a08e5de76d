package batchlane_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// TestBatcher_CanceledBeforeSendShowsCanceled: a job canceled while it waited for a batch, or in
// a batch not yet sent, shows batch_state canceled for good, as the job API documents it. It kept
// waiting (a job no batch would take) or showed not_sent (no documented state), for good.
func TestBatcher_CanceledBeforeSendShowsCanceled(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			waiting := b.submit(t, "canceled while waiting", 0, 0)
			_, err := b.store.Cancel(t.Context(), waiting.ID)
			require.NoError(t, err)
			require.Equal(t, "canceled", *b.get(t, waiting.ID).BatchState, "at its cancel")

			keep, committed := b.submit(t, "keep", 0, 0), b.submit(t, "canceled while committed", 0, 0)
			b.clock.Advance(fill)
			crashed := b.batcher(b.client)
			batchlane.CrashAfterCommit(crashed, context.Canceled)
			require.ErrorIs(t, crashed.Once(t.Context()), context.Canceled)
			require.Equal(t, "committed", *b.get(t, committed.ID).BatchState)
			_, err = b.store.Cancel(t.Context(), committed.ID)
			require.NoError(t, err)
			require.Equal(t, "canceled", *b.get(t, committed.ID).BatchState, "at its cancel")

			once(t, b.batcher(b.client)) // sends the batch without it
			require.Equal(t, 1, b.sim.BatchStats().Requests, "only the job still waiting is sent")
			require.Equal(t, jobs.StatusRunning, b.get(t, keep.ID).Status)
			for _, id := range []string{waiting.ID, committed.ID} {
				got := b.get(t, id)
				require.Equal(t, jobs.StatusCanceled, got.Status)
				require.Nil(t, got.BatchID, "in no sent batch")
				require.Equal(t, "canceled", *got.BatchState, "after the send")
			}
		})
	}
}
