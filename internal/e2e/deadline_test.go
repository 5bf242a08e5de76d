package e2e_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeadline_HoldsWhileTheJobWaits: a job whose deadline passes while it waits for its
// credential's schedule is failed at its deadline, not when its turn comes.
func TestDeadline_HoldsWhileTheJobWaits(t *testing.T) {
	t.Parallel()
	// Given a credential that sends one request now and the next 100 s later...
	b := setup(t, setupOpts{limits: "{requests_per_second: 0.01, burst: 1}"})
	first := b.submit(t, anthropicBody("takes the only slot"))
	require.Equal(t, "succeeded", b.waitTerminal(t, first)["status"])

	// ... when a job with a 2 s timeout waits for that next slot, then it fails with
	// deadline_exceeded a few seconds after its deadline, without a call.
	id := b.submit(t, `{"timeout":"2s","request":{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"in a hurry"}]}}`)
	job := b.waitTerminal(t, id)
	require.Equal(t, "failed", job["status"])
	require.Equal(t, "deadline_exceeded", job["last_error"].(map[string]any)["class"])
	deadline, err := time.Parse(time.RFC3339Nano, job["deadline"].(string))
	require.NoError(t, err)
	finished, err := time.Parse(time.RFC3339Nano, job["finished_at"].(string))
	require.NoError(t, err)
	// The deadline pass runs every second; the slack is for a loaded machine. Failed when its
	// slot came, it would end 98 s after its deadline.
	require.Less(t, finished.Sub(deadline), 10*time.Second)
	require.EqualValues(t, 0, job["attempts"])
	require.Equal(t, 1, b.sim.Stats().Requests)
}
