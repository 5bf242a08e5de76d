package api

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/httpserve/httpservetest"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tenant"
)

// TestCancel_EndedJobTakesNoPlace: a cancel takes one of its tenant's places among the keyed
// submits and cancels for its transaction (tenantGate). A cancel that needs none (of a job that
// does not exist, or has ended: succeeded, canceled before) only reads, as a poll does: it is
// answered at once as ever (404, 409 job_terminal, 200 and the canceled job), not 429
// too_many_cancels while its tenant's places are full. A client resending the DELETE whose
// answer it lost must learn that its cancel took, whatever its tenant's other requests do.
func TestCancel_EndedJobTakesNoPlace(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{storeWait: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), httpservetest.Wait)
	defer cancel()
	succeeded := b.create(t, "")
	b.attempt(t, succeeded.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
	canceled := b.create(t, "")
	_, err := b.store.Cancel(ctx, canceled.ID)
	require.NoError(t, err)
	live := b.create(t, "")

	// The tenant's places all held (its keyed submits' and cancels' transactions).
	for range b.srv.keyed.max {
		release, err := b.srv.keyed.enter(ctx, tenant.Default, 0, tooManyCancels)
		require.NoError(t, err)
		defer release()
	}

	r := b.do(t, http.MethodDelete, "/v1/jobs/"+succeeded.ID, "", nil)
	require.Equal(t, http.StatusConflict, r.status, "a succeeded job's cancel: %v", r.body)
	require.Equal(t, "job_terminal", r.body["error"].(map[string]any)["type"])
	r = b.do(t, http.MethodDelete, "/v1/jobs/"+canceled.ID, "", nil)
	require.Equal(t, http.StatusOK, r.status, "a canceled job's cancel, resent: %v", r.body)
	require.Equal(t, "canceled", r.body["status"])
	r = b.do(t, http.MethodDelete, "/v1/jobs/"+uuid.NewString(), "", nil)
	require.Equal(t, http.StatusNotFound, r.status, "a missing job's cancel: %v", r.body)

	// A cancel with a transition to make still waits for a place.
	r = b.do(t, http.MethodDelete, "/v1/jobs/"+live.ID, "", nil)
	require.Equal(t, http.StatusTooManyRequests, r.status, "a live job's cancel: %v", r.body)
	require.Equal(t, "too_many_cancels", r.body["error"].(map[string]any)["type"])
	got, err := b.store.Get(ctx, live.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status)
}
