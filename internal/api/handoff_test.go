package api

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
)

// recordingProcessor is a dispatch.FreshProcessor that admits every job's first attempt with a
// lease of its own when begin is true, and keeps the jobs it was asked to admit, the jobs it
// was given to deliver (doing nothing with them) and the admissions released.
type recordingProcessor struct {
	mu       sync.Mutex
	begin    bool
	asked    []jobs.Job
	run      []jobs.Job
	released int
}

type recordedAdmission struct {
	p     *recordingProcessor
	begin *jobs.Begin
}

func (a *recordedAdmission) Begin() *jobs.Begin { return a.begin }

func (a *recordedAdmission) Release(context.Context) {
	a.p.mu.Lock()
	defer a.p.mu.Unlock()
	a.p.released++
}

func (p *recordingProcessor) AdmitFirst(_ context.Context, job *jobs.Job) dispatch.Admission {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, *job)
	a := &recordedAdmission{p: p}
	if p.begin {
		a.begin = &jobs.Begin{LeaseToken: uuid.NewString()}
	}
	return a
}

func (p *recordingProcessor) ProcessFresh(_ context.Context, job *jobs.Job, _ dispatch.Admission) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.run = append(p.run, *job)
	return nil
}

func (p *recordingProcessor) state() (asked, run []jobs.Job, released int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]jobs.Job(nil), p.asked...), append([]jobs.Job(nil), p.run...), p.released
}

// runHandoff runs h until the test ends (or stop is called), failing the test if Run does not
// return in time.
func runHandoff(t testing.TB, h *dispatch.Handoff) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("the Handoff's Run did not return")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestSubmit_HandsNewJobsToThisProcess: with a Handoff (llmq serve), a submit claims a slot and
// the first attempt's admission for the job before its insert; with an admission that says so,
// the insert starts the attempt (the job answers running, with its lease and both events); the
// job then goes to this process's delivery with its request and gets no asynq task. A replay
// asks for no admission and runs nothing; a job whose insert fails releases its admission and
// runs nothing; a batch-lane job is not claimed; a job the Handoff declines (it has shut down)
// is enqueued.
func TestSubmit_HandsNewJobsToThisProcess(t *testing.T) {
	t.Parallel()
	p := &recordingProcessor{begin: true}
	b := setup(t, setupOpts{handoff: p, batchWindows: map[string]time.Duration{"default": time.Hour}})
	ran := func(n int) []jobs.Job {
		t.Helper()
		var run []jobs.Job
		require.Eventually(t, func() bool {
			_, run, _ = p.state()
			return len(run) == n
		}, 30*time.Second, 5*time.Millisecond, "deliveries started")
		return run
	}
	noTask := func(id string) {
		t.Helper()
		_, err := b.inspector.GetTaskInfo(b.queue, id)
		require.True(t, errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound),
			"a job the handoff took has no task: %v", err)
	}

	// Admitted at once: the insert starts the attempt.
	r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m","max_tokens":5}}`, map[string]string{"Idempotency-Key": "k1"})
	require.Equal(t, http.StatusAccepted, r.status, "%v", r.body)
	id := r.body["id"].(string)
	require.Equal(t, "running", r.body["status"])
	require.EqualValues(t, 1, r.body["attempts"])
	asked, _, _ := p.state()
	require.Len(t, asked, 1)
	require.Equal(t, id, asked[0].ID, "the admission was asked under the ID the job was created with")
	require.Equal(t, jobs.StatusQueued, asked[0].Status)
	run := ran(1)
	require.Equal(t, id, run[0].ID)
	require.Equal(t, jobs.StatusRunning, run[0].Status)
	require.NotNil(t, run[0].LeaseToken, "the delivery holds the attempt's lease")
	require.Equal(t, 2, run[0].EventSeq)
	require.JSONEq(t, `{"model":"m","max_tokens":5}`, string(run[0].Request))
	events, err := b.store.Events(t.Context(), id, 0)
	require.NoError(t, err)
	require.Len(t, events, 2)
	require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusRunning}, []jobs.Status{events[0].Type, events[1].Type})
	noTask(id)

	// A replay of the same key is not a new job: no admission is asked for (no rate slot taken),
	// nothing runs.
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m","max_tokens":5}}`, map[string]string{"Idempotency-Key": "k1"})
	require.Equal(t, http.StatusOK, r.status, "%v", r.body)
	asked, run, released := p.state()
	require.Len(t, asked, 1)
	require.Len(t, run, 1)
	require.Zero(t, released)

	// An insert that fails after the admission (Postgres refuses a NUL in metadata): the
	// admission is released, nothing runs.
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"},"metadata":{"a":"\u0000"}}`, nil)
	require.Equal(t, http.StatusBadRequest, r.status, "%v", r.body)
	asked, run, released = p.state()
	require.Len(t, asked, 2)
	require.Len(t, run, 1)
	require.Equal(t, 1, released)

	// Admitted for later: the job is created queued and goes to the delivery all the same.
	p.mu.Lock()
	p.begin = false
	p.mu.Unlock()
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, nil)
	require.Equal(t, http.StatusAccepted, r.status, "%v", r.body)
	queued := r.body["id"].(string)
	require.Equal(t, "queued", r.body["status"])
	run = ran(2)
	require.Equal(t, queued, run[1].ID)
	require.Equal(t, jobs.StatusQueued, run[1].Status)
	noTask(queued)

	// A batch-lane job is the batcher's: not claimed.
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"lane":"batch","request":{"model":"m"}}`, nil)
	require.Equal(t, http.StatusAccepted, r.status, "%v", r.body)
	asked, _, _ = p.state()
	require.Len(t, asked, 3)

	// Declined (the Handoff has shut down): enqueued as a task.
	b.stopHandoff()
	r = b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m"}}`, nil)
	require.Equal(t, http.StatusAccepted, r.status, "%v", r.body)
	declined := r.body["id"].(string)
	_, err = b.inspector.GetTaskInfo(b.queue, declined)
	require.NoError(t, err, "a job the handoff declined is enqueued")
	asked, run, released = p.state()
	require.Len(t, asked, 3)
	require.Len(t, run, 2)
	require.Equal(t, 1, released)
}

// TestSubmit_HandoffCountsDeclinesOfNewJobsOnly checks that llmq_worker_handoffs_total counts a
// decline only for a job created and enqueued instead of handed over (a low job, or one offered
// once the Handoff has shut down): not for a replay, a submit whose insert failed, or a
// batch-lane job (the batcher's, never offered).
func TestSubmit_HandoffCountsDeclinesOfNewJobsOnly(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	p := &recordingProcessor{begin: true}
	b := setup(t, setupOpts{handoff: p, registry: reg, batchWindows: map[string]time.Duration{"default": time.Hour}})
	count := func(outcome string) float64 {
		t.Helper()
		return testutil.ToFloat64(gatheredCounter(t, reg, "llmq_worker_handoffs_total", "outcome", outcome))
	}
	submit := func(body string, header map[string]string, status int) {
		t.Helper()
		r := b.do(t, http.MethodPost, "/v1/jobs", body, header)
		require.Equal(t, status, r.status, "%v", r.body)
	}
	key := map[string]string{"Idempotency-Key": "k1"}

	submit(`{"request":{"model":"m"}}`, key, http.StatusAccepted)
	require.EqualValues(t, 1, count("taken"))
	submit(`{"lane":"batch","request":{"model":"m"}}`, nil, http.StatusAccepted)
	require.Zero(t, count("declined"), "a batch-lane job is never offered")
	submit(`{"priority":"low","request":{"model":"m"}}`, nil, http.StatusAccepted)
	require.EqualValues(t, 1, count("declined"), "a low job is enqueued instead")

	b.stopHandoff() // every offer is declined from now on
	submit(`{"request":{"model":"m"}}`, key, http.StatusOK)
	require.EqualValues(t, 1, count("declined"), "a replay is no new job")
	submit(`{"request":{"model":"m"},"metadata":{"a":"\u0000"}}`, nil, http.StatusBadRequest)
	require.EqualValues(t, 1, count("declined"), "a refused submit created no job")
	submit(`{"request":{"model":"m"}}`, nil, http.StatusAccepted)
	require.EqualValues(t, 2, count("declined"), "a new job enqueued instead")
	require.EqualValues(t, 1, count("taken"))
}

// gatheredCounter returns the counter name{label=value} gathered from reg, as a collector that
// testutil.ToFloat64 reads, failing the test if there is none.
func gatheredCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name}, m.GetCounter().GetValue)
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return nil
}
