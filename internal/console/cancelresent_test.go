package console_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/redistest"
)

// TestJobCancel_ResentAbortsItsTask: a cancel committed whose abort never ran (its answer lost
// with the commit's, or Redis refused it) left the job's task in Redis, and a worker's attempt
// went on until its lease's next renewal; the operator's second click aborts it (neither counted
// nor audited again). It answered "already canceled" and left the task.
func TestJobCancel_ResentAbortsItsTask(t *testing.T) {
	t.Parallel()
	url := redistest.URL()
	queue := redistest.Queue(t, url)
	opt, err := dispatch.RedisConnOpt(url)
	require.NoError(t, err)
	insp := asynq.NewInspector(opt)
	aclient := asynq.NewClient(opt)
	t.Cleanup(func() { _ = insp.Close(); _ = aclient.Close() })
	enq := dispatch.NewEnqueuer(aclient, queue, nil)
	b := setupTasks(t, dispatch.NewTasks(insp, enq))
	c := b.login(t)
	logged := b.audit(t) // the login
	ctx := context.Background()
	job := b.jobs.Create(t, jobstest.Opts{})
	require.NoError(t, enq.Enqueue(ctx, job.ID, "", time.Time{}))
	_, err = b.jobs.Store.Cancel(ctx, job.ID) // the first cancel: committed, no abort
	require.NoError(t, err)

	var res struct {
		Message string `json:"message"`
		Changed bool   `json:"changed"`
	}
	c.json(http.MethodPost, "/console/api/jobs/"+job.ID+"/cancel", nil, &res)
	require.False(t, res.Changed)
	_, err = insp.GetTaskInfo(queue, job.ID)
	require.ErrorIs(t, err, asynq.ErrTaskNotFound, "the second click aborted the task")
	require.Equal(t, logged, b.audit(t), "nothing audited")
	b.mu.Lock()
	require.Empty(t, b.canceled, "nothing counted")
	b.mu.Unlock()
}
