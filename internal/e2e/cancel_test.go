package e2e_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

// attemptsOf counts the job's recorded provider calls.
func (b *testBundle) attemptsOf(t *testing.T, id string) int {
	t.Helper()
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	defer pool.Close()
	var n int
	require.NoError(t, pool.QueryRow(b.ctx, `SELECT count(*) FROM job_attempts WHERE job_id = $1`, id).Scan(&n))
	return n
}

func TestCancel_AbortsTheInFlightCall(t *testing.T) {
	t.Parallel()
	// A renewal of the attempt's lease that finds the job canceled stops the call too: renewing
	// once an hour, it cannot be what stops the call within the test's deadline, and the
	// simulator's hang and the attempt's timeout (5 min) outlast that deadline too.
	b := setup(t, setupOpts{sim: llmsim.Config{Faults: llmsim.Faults{Hang: true}}, leaseRenewal: time.Hour})
	id := b.submit(t, anthropicBody("never answered"))
	s := openEvents(t, b.apiURL, id, "0")
	require.Eventually(t, func() bool { return b.sim.Stats().InFlight == 1 }, 20*time.Second, 5*time.Millisecond,
		"the worker's call reaches the simulator")

	r := b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)
	require.Equal(t, http.StatusOK, r.status, "body %v", r.body)
	require.Equal(t, "canceled", r.body["status"])

	// The worker's provider call is aborted by the cancel: the simulator sees its client go away.
	require.Eventually(t, func() bool {
		st := b.sim.Stats()
		return st.InFlight == 0 && st.ByStatus[llmsim.StatusClientClosed] == 1
	}, 30*time.Second, time.Millisecond, "the cancel aborts the call")

	// The aborted call is recorded, and no result is stored once it has been.
	require.Eventually(t, func() bool { return b.attemptsOf(t, id) == 1 }, 30*time.Second, 5*time.Millisecond)
	job := b.do(t, http.MethodGet, "/v1/jobs/"+id, "", nil).body
	require.Equal(t, "canceled", job["status"])
	require.Nil(t, job["result"])
	require.Equal(t, 1, b.sim.Stats().Requests)

	evs := s.rest(t)
	require.Equal(t, []string{"queued/1", "running/2", "canceled/3"}, eventNames(evs))
	require.Nil(t, evs[2].job["result"])
}

func TestCancel_QueuedJobIsNeverCalled(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true})
	canceled := b.submit(t, anthropicBody("not wanted"))
	r := b.do(t, http.MethodDelete, "/v1/jobs/"+canceled, "", nil)
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "canceled", r.body["status"])

	b.startWorker(t)
	// A job submitted after it runs: the worker has been through the queue.
	later := b.submit(t, anthropicBody("wanted"))
	require.Equal(t, "succeeded", b.waitTerminal(t, later)["status"])

	job := b.do(t, http.MethodGet, "/v1/jobs/"+canceled, "", nil).body
	require.Equal(t, "canceled", job["status"])
	require.EqualValues(t, 0, job["attempts"])
	require.Equal(t, 0, b.attemptsOf(t, canceled))
	require.Equal(t, 1, b.sim.Stats().Requests)
}

func TestCancel_FinishedJobIs409(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	id := b.submit(t, anthropicBody("done"))
	b.waitTerminal(t, id)

	r := b.do(t, http.MethodDelete, "/v1/jobs/"+id, "", nil)
	require.Equal(t, http.StatusConflict, r.status)
	require.Equal(t, map[string]any{"type": "job_terminal", "message": "job is succeeded"}, r.body["error"])
	require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"])
}
