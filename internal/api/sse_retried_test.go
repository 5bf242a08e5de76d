package api

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// A dead job an operator retries goes on after its dead event (api/openapi.yaml): a reconnect at
// the dead event's id answers 204 while the job is dead, and once it was retried gets the queued
// event that follows, and the rest.
func TestEvents_ARetriedDeadJobGoesOnAfterItsDeadEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	job := b.create(t, "")
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRateLimitedNoRetryAfter})
	require.Equal(t, []string{"dead/3"}, names(openStream(t, b.url, job.ID, "").rest(t)))
	r := b.do(t, http.MethodGet, "/v1/jobs/"+job.ID+"/events", "", map[string]string{"Last-Event-ID": "3"})
	require.Equal(t, http.StatusNoContent, r.status)

	_, err := b.store.RetryDead(t.Context(), jobs.DeadFilter{IDs: []string{job.ID}}, nil)
	require.NoError(t, err)
	s := openStream(t, b.url, job.ID, "3")
	first := s.nextEvent(t)
	require.Equal(t, []string{"queued/4"}, names([]sseFrame{first}))
	require.Nil(t, jobData(t, first)["dead_reason"])
	b.attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: []byte(`{}`)})
	require.Equal(t, []string{"running/5", "succeeded/6"}, names(s.rest(t)))
}
