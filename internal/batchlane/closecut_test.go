package batchlane_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// TestBatcher_RestartBeforeCloseClosesTheBatchEnded: the leader records an ended batch's
// results and dies before it closes the batch. The next leader finds the batch open with no job
// waiting for it: it ended at the provider, so it is closed as ended (counted ended, its state
// the provider's), not canceled at the provider (a cancel of a batch that has ended, refused or
// pointless) and counted canceled as if no job had waited for it.
func TestBatcher_RestartBeforeCloseClosesTheBatchEnded(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			j := b.submit(t, "x", 0, 0)
			b.clock.Advance(fill)
			once(t, b.batcher(nil))
			ref := b.batchRefs(t)[j.ID]
			require.NotEmpty(t, ref)

			// Given a leader that records the batch's results and dies before closing it,
			b.clock.Advance(2 * time.Hour)
			died := b.batcher(nil)
			crash := errors.New("the process died")
			batchlane.CrashAfterRecord(died, crash)
			require.ErrorIs(t, died.Once(t.Context()), crash)
			require.Equal(t, jobs.StatusSucceeded, b.get(t, j.ID).Status)

			// when the next leader passes,
			once(t, b.batcher(nil))
			// then the batch is closed ended, without a cancel.
			require.Zero(t, b.sim.BatchStats().Cancels, "an ended batch was canceled")
			require.Equal(t, float64(0), b.counter(t, "batches", "canceled"))
			require.Equal(t, float64(1), b.counter(t, "batches", "ended"))
			var state string
			require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT state FROM provider_batches WHERE id = $1`, ref).Scan(&state))
			require.Equal(t, "ended", state)
		})
	}
}
