package batchlane_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBatcher_CanceledJobShowsItsBatchsEnd: a job canceled while in a provider batch shows its
// batch's state to its end, as the batch's other jobs do: the cancel the provider accepted once
// none of the batch's jobs waited, then the state the batch ended in. It showed in_progress, as
// last polled before its cancel, for good: a canceled job whose batch seemed still to run.
func TestBatcher_CanceledJobShowsItsBatchsEnd(t *testing.T) {
	t.Parallel()
	for provider, final := range map[string]string{"anthropic": "ended", "openai": "cancelled"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			j := b.submit(t, "x", 0, 0)
			bt := b.batcher(b.client)
			b.clock.Advance(fill)
			once(t, bt)
			require.Equal(t, "in_progress", *b.get(t, j.ID).BatchState)
			_, err := b.store.Cancel(t.Context(), j.ID)
			require.NoError(t, err)
			b.clock.Advance(time.Minute)
			once(t, bt) // canceled at the provider
			require.Equal(t, "canceling", *b.get(t, j.ID).BatchState)
			b.clock.Advance(10 * time.Minute)
			once(t, bt) // ended: closed
			require.Equal(t, "canceled", b.batchState(t))
			require.Equal(t, final, *b.get(t, j.ID).BatchState, "the batch's state at its end")
		})
	}
}
