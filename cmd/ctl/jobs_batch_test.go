package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// TestJobsShow_BatchLane: a batch-lane job shows its lane and its place in the batch lane, in the
// table and in JSON.
func TestJobsShow_BatchLane(t *testing.T) {
	t.Parallel()
	b := setupJobs(t)
	job, _, err := b.store.Create(context.Background(), jobs.CreateParams{Tenant: "default", Credential: "default",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: 24 * time.Hour, Lane: jobs.LaneBatch})
	require.NoError(t, err)

	r := run(t, "--database-url", b.url, "jobs", "show", job.ID)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	rows := fields(r.out)
	require.Equal(t, "batch", rows["lane"])
	require.Equal(t, "- (waiting)", rows["batch"], "no provider batch yet")

	r = run(t, "--database-url", b.url, "jobs", "show", "--json", job.ID)
	require.Equal(t, 0, r.code, "stderr %q", r.errOut)
	var got struct {
		Job struct {
			Lane       string  `json:"lane"`
			BatchID    *string `json:"batch_id"`
			BatchState string  `json:"batch_state"`
		} `json:"job"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.out), &got), "output %q", r.out)
	require.Equal(t, "batch", got.Job.Lane)
	require.Nil(t, got.Job.BatchID)
	require.Equal(t, "waiting", got.Job.BatchState)
}
