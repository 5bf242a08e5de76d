package batchlane_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/batchlane"
	"github.com/llmq/llmq/internal/jobs"
)

// TestBatcher_UnconfiguredCredentialsJobs: a job waiting for a batch on a credential the
// batcher's lanes lack, created before the batcher, is on a credential the config removed: it
// goes online (lane_off), where the executor moves it to its fallbacks or dead-letters it. One
// created after the batcher is on a credential a newer config added (a rolling deploy): it is
// left for that config's batcher, until the rollout's grace has passed.
func TestBatcher_UnconfiguredCredentialsJobs(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t, setupOpts{})
	create := func(credential string) *jobs.Job {
		job, _, err := b.store.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: credential, Lane: jobs.LaneBatch,
			Request:     json.RawMessage(`{"model":"claude-sim","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`),
			MaxAttempts: 3, Timeout: 24 * time.Hour})
		require.NoError(t, err)
		return job
	}
	// Given a job on a removed credential, created before the batcher,
	removed := create("removed")
	b.clock.Set(time.Now()) // the batcher starts after it
	bt := batchlane.New(batchlane.Config{Pool: b.pool, Now: b.clock.Now, Metrics: b.metrics, RolloutGrace: 15 * time.Minute,
		Lanes: []batchlane.Lane{{Credential: "default", Client: b.client, Config: b.cfg}},
		Enqueue: func(_ context.Context, id string, _ jobs.Priority) error {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.enqueued = append(b.enqueued, id)
			return nil
		}})
	// and one on a credential a newer config added, created after it,
	b.clock.Advance(time.Second)
	added := create("added")

	// a pass sends the first online and leaves the second waiting,
	require.NoError(t, bt.Once(ctx))
	require.Equal(t, []string{removed.ID}, b.online())
	got := b.get(t, removed.ID)
	require.Equal(t, jobs.LaneOnline, got.Lane)
	require.Equal(t, jobs.LaneBatch, b.get(t, added.ID).Lane)

	// until the rollout's grace has passed.
	b.clock.Advance(15 * time.Minute)
	require.NoError(t, bt.Once(ctx))
	require.Equal(t, jobs.LaneOnline, b.get(t, added.ID).Lane)
}
