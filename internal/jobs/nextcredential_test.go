package jobs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// TestStore_NextCredentialMovesOnceFromTheCredentialItWasAskedFrom: two deliveries of one job at
// once (an asynq redelivery beside a rescue task) both read it on its own credential, find that
// credential paused and fail it over. The second move is from a credential the job has already
// left: it moves nothing, so the job is on its first fallback, not past it on its second.
func TestStore_NextCredentialMovesOnceFromTheCredentialItWasAskedFrom(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	job, _, err := b.Store.Create(t.Context(), jobs.CreateParams{Tenant: "default", Credential: "default",
		Fallbacks: []string{"backup", "spare"}, Fingerprint: "fp", Request: json.RawMessage(`{"model":"m"}`),
		MaxAttempts: 3, Timeout: time.Minute})
	require.NoError(t, err)
	first, err := b.Store.Get(t.Context(), job.ID)
	require.NoError(t, err)
	second, err := b.Store.Get(t.Context(), job.ID)
	require.NoError(t, err)

	moved, err := b.Store.NextCredential(t.Context(), first.ID, first.CredentialIndex)
	require.NoError(t, err)
	require.True(t, moved, "the first delivery moves the job on")
	moved, err = b.Store.NextCredential(t.Context(), second.ID, second.CredentialIndex)
	require.NoError(t, err)
	require.False(t, moved, "the second delivery's move is from a credential the job has left")

	j, err := b.Store.Get(t.Context(), job.ID)
	require.NoError(t, err)
	require.Equal(t, "backup", j.CurrentCredential(), "the job is on its first fallback, none skipped")
}
