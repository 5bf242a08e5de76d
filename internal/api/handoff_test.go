package api

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
)

// recordingHandoff takes the jobs offered to it while take is true, and keeps each.
type recordingHandoff struct {
	take bool

	mu      sync.Mutex
	offered []jobs.Job
}

func (h *recordingHandoff) Offer(job *jobs.Job) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.offered = append(h.offered, *job)
	return h.take
}

func (h *recordingHandoff) jobs() []jobs.Job {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]jobs.Job(nil), h.offered...)
}

// TestSubmit_HandsNewJobsToThisProcess: with a Handoff (llmq serve), a new job is offered to it
// with its request, and a job it takes gets no asynq task; a job it declines is enqueued; a
// replay and a batch-lane job are not offered.
func TestSubmit_HandsNewJobsToThisProcess(t *testing.T) {
	t.Parallel()
	h := &recordingHandoff{take: true}
	b := setup(t, setupOpts{handoff: h, batchWindows: map[string]time.Duration{"default": time.Hour}})

	// Taken: offered once, with the request as stored, and no task.
	r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m","max_tokens":5}}`, map[string]string{"Idempotency-Key": "k1"})
	require.Equal(t, http.StatusAccepted, r.status, "%v", r.body)
	id := r.body["id"].(string)
	offered := h.jobs()
	require.Len(t, offered, 1)
	require.Equal(t, id, offered[0].ID)
	require.Equal(t, jobs.StatusQueued, offered[0].Status)
	require.JSONEq(t, `{"model":"m","max_tokens":5}`, string(offered[0].Request))
	_, err := b.inspector.GetTaskInfo(b.queue, id)
	require.True(t, errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound),
		"a job the handoff took has no task: %v", err)

	// A replay of the same key is not a new job: not offered again.
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m","max_tokens":5}}`, map[string]string{"Idempotency-Key": "k1"})
	require.Equal(t, http.StatusOK, r.status, "%v", r.body)
	require.Len(t, h.jobs(), 1)

	// A batch-lane job is the batcher's: not offered.
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"lane":"batch","request":{"model":"m"}}`, nil)
	require.Equal(t, http.StatusAccepted, r.status, "%v", r.body)
	require.Len(t, h.jobs(), 1)

	// Declined: enqueued as a task.
	h.mu.Lock()
	h.take = false
	h.mu.Unlock()
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, nil)
	require.Equal(t, http.StatusAccepted, r.status, "%v", r.body)
	declined := r.body["id"].(string)
	require.Len(t, h.jobs(), 2)
	require.Equal(t, declined, h.jobs()[1].ID)
	_, err = b.inspector.GetTaskInfo(b.queue, declined)
	require.NoError(t, err, "a job the handoff declined is enqueued")
}
