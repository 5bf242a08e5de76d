package jobs_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestStore_BatchLane: a batch-lane job is stored with its lane and waiting for a batch, and the
// sweeper's walk (ListUnfinished) leaves it out: it has no asynq task to miss, the batcher holds
// it. An online job is unchanged: lane online, no batch.
func TestStore_BatchLane(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := jobs.NewStore(pgtest.Pool(t), nil)
	create := func(lane jobs.Lane) *jobs.Job {
		j, _, err := s.Create(ctx, jobs.CreateParams{Tenant: "default", Credential: "default", Request: json.RawMessage(`{}`),
			MaxAttempts: 3, Timeout: time.Hour, Lane: lane})
		require.NoError(t, err)
		return j
	}
	online, batch, unset := create(jobs.LaneOnline), create(jobs.LaneBatch), create("")

	require.Equal(t, jobs.LaneBatch, batch.Lane)
	require.Equal(t, "waiting", *batch.BatchState)
	require.Equal(t, jobs.LaneOnline, unset.Lane, "no lane: online")
	require.Nil(t, online.BatchState)
	require.Nil(t, online.CostClass)

	page, err := s.ListUnfinished(ctx, "", 100)
	require.NoError(t, err)
	var ids []string
	for _, u := range page {
		ids = append(ids, u.ID)
	}
	require.ElementsMatch(t, []string{online.ID, unset.ID}, ids)
}
