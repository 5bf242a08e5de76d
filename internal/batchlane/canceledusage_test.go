package batchlane_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
)

// answeredBeforeCancel is a client whose batches' results also hold an answer for job, as a
// batch canceled at the provider holds for the requests it ran before its cancel (llmsim's
// cancel ends them all canceled).
type answeredBeforeCancel struct {
	batchlane.Client
	job string
}

func (c answeredBeforeCancel) Results(ctx context.Context, id string) ([]batchlane.Result, error) {
	rs, err := c.Client.Results(ctx, id)
	return append(rs, batchlane.Result{CustomID: c.job, Kind: batchlane.Succeeded,
		Body: json.RawMessage(`{"usage":{"input_tokens":7,"output_tokens":3}}`)}), err
}

// TestBatcher_CanceledBatchKeepsItsAnswersUsage: a batch canceled at the provider (none of its
// jobs waits any more) holds the answers of the requests the provider ran before the cancel,
// which it charged for: once it ended, a canceled job's answer keeps its usage, as it does in a
// batch that ended on its own. It was lost: the batch was closed without reading its results.
func TestBatcher_CanceledBatchKeepsItsAnswersUsage(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{"anthropic", "openai"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: provider})
			j := b.submit(t, "x", 0, 0)
			bt := b.batcher(answeredBeforeCancel{Client: b.client, job: j.ID})
			b.clock.Advance(fill)
			once(t, bt)
			_, err := b.store.Cancel(t.Context(), j.ID)
			require.NoError(t, err)
			b.clock.Advance(time.Minute)
			once(t, bt) // canceled at the provider
			b.clock.Advance(10 * time.Minute)
			once(t, bt) // ended: closed
			require.Equal(t, float64(1), b.counter(t, "batches", "canceled"))
			got := b.get(t, j.ID)
			require.JSONEq(t, `{"input_tokens":7,"output_tokens":3}`, string(got.Usage),
				"the answer's usage is kept")
			require.Equal(t, 1, b.sim.BatchStats().Cancels)
		})
	}
}

// cancelling is a client whose polls report an OpenAI batch canceled at the provider still
// cancelling (llmsim ends it at its cancel) until ended is set.
type cancelling struct {
	batchlane.Client
	ended *atomic.Bool
}

func (c cancelling) Poll(ctx context.Context, id string) (batchlane.State, error) {
	st, err := c.Client.Poll(ctx, id)
	if err == nil && st.Provider == "cancelled" && !c.ended.Load() {
		return batchlane.State{Provider: "cancelling"}, nil
	}
	return st, err
}

// TestBatcher_CancelNotRecorded: a batch whose cancel the provider accepted but whose row does
// not say so (its batcher died, or lost the lead, between the cancel and the row's update) is
// not canceled again, and is closed canceled (counted so), its files deleted, whether the poll
// finds it still cancelling or already ended. It was canceled again, or closed ended.
func TestBatcher_CancelNotRecorded(t *testing.T) {
	t.Parallel()
	for name, endedFirst := range map[string]bool{"Cancelling": false, "Ended": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, setupOpts{provider: "openai"})
			var ended atomic.Bool
			ended.Store(endedFirst)
			bt := b.batcher(cancelling{Client: b.client, ended: &ended})
			id := b.canceledInBatch(t, bt)
			require.NoError(t, b.client.Cancel(t.Context(), id)) // the batcher that died
			b.clock.Advance(time.Minute)
			once(t, bt)
			require.Equal(t, 1, b.sim.BatchStats().Cancels, "canceled once")
			ended.Store(true)
			b.clock.Advance(10 * time.Minute)
			once(t, bt)
			require.Equal(t, "canceled", b.batchState(t))
			require.Equal(t, float64(1), b.counter(t, "batches", "canceled"))
			require.Zero(t, b.counter(t, "batches", "ended"))
			require.Equal(t, 1, b.sim.BatchStats().Cancels, "canceled once")
			require.Positive(t, b.sim.BatchStats().Deletes)
		})
	}
}
