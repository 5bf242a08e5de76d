package e2e_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/credpause"
)

// TestBatchLane_EndToEnd: through the API, a job with "lane": "batch" goes through the
// provider's batch API (the worker's batcher; no online call, so no online limiter slot) and
// ends as an online job does, with the answer, usage and cost class batch; an online job
// submitted meanwhile on the same credential is unaffected.
func TestBatchLane_EndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{extra: "batch: { enabled: true, max_wait_to_fill: 50ms, poll_interval: 100ms }"})
	batchBody := `{"lane":"batch",` + anthropicBody("wait for it")[1:]
	batchID := b.submit(t, batchBody)
	stream := openEvents(t, b.apiURL, batchID, "")
	onlineID := b.submit(t, anthropicBody("now"))

	online := b.waitTerminal(t, onlineID)
	require.Equal(t, "succeeded", online["status"])
	require.Equal(t, "online", online["cost_class"])
	require.Nil(t, online["batch_id"])

	job := b.waitTerminal(t, batchID)
	require.Equal(t, "succeeded", job["status"], "%v", job["last_error"])
	require.Equal(t, "batch", job["lane"])
	require.Equal(t, "batch", job["cost_class"])
	require.NotEmpty(t, job["batch_id"])
	require.Equal(t, "ended", job["batch_state"])
	require.NotNil(t, job["usage"])
	require.Contains(t, job["result"].(map[string]any)["content"].([]any)[0].(map[string]any)["text"], "wait for it")

	// SSE clients see the online statuses, and the lane, batch id and cost class in the data.
	evs := stream.rest(t)
	require.Equal(t, []string{"queued/1", "running/2", "succeeded/3"}, eventNames(evs))
	last := evs[len(evs)-1].job
	require.Equal(t, "batch", last["lane"])
	require.Equal(t, job["batch_id"], last["batch_id"])
	require.Equal(t, "batch", last["cost_class"])

	require.Equal(t, 1, b.sim.Stats().Requests, "one online call: the online job's; the batch job made none")
	st := b.sim.BatchStats()
	require.Equal(t, 1, st.Created)
	require.Equal(t, 1, st.Requests)
}

// TestBatchLane_DeadLetterAlerts: a batch-lane job that uses its last attempt in a batch is a
// dead letter like an online one: the webhook is told, and llmq_dead_letters_total (which the
// LLMQDeadLetters rule reads) counts it.
func TestBatchLane_DeadLetterAlerts(t *testing.T) {
	t.Parallel()
	hook := &webhook{}
	hookSrv := httptest.NewServer(hook)
	t.Cleanup(hookSrv.Close)
	b := setup(t, setupOpts{webhookURL: hookSrv.URL,
		extra: "batch: { enabled: true, max_wait_to_fill: 50ms, poll_interval: 100ms }"})
	id := b.submit(t, `{"lane":"batch","max_attempts":1,`+anthropicBody("llmsim-batch-server-error")[1:])

	job := b.waitTerminal(t, id)
	require.Equal(t, "dead", job["status"], "%v", job["last_error"])
	require.Equal(t, "retries_exhausted", job["dead_reason"])

	require.Eventually(t, func() bool { return len(hook.received()) > 0 }, 30*time.Second, 10*time.Millisecond,
		"no dead-letter alert reached the webhook")
	alerts := hook.received()
	require.Len(t, alerts, 1)
	require.Equal(t, "default", alerts[0].Credential)
	require.Equal(t, "retries_exhausted", alerts[0].Reason)
	require.Equal(t, id, alerts[0].JobID)

	families, err := b.workerMetrics.Gather()
	require.NoError(t, err)
	value := func(name string, labels map[string]string) float64 {
		for _, f := range families {
			if f.GetName() != name {
				continue
			}
		series:
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
						continue series
					}
				}
				return m.GetCounter().GetValue()
			}
		}
		return 0
	}
	require.Equal(t, 1.0, value("llmq_dead_letters_total", map[string]string{"credential": "default", "reason": "retries_exhausted"}))
}

// TestBatchLane_PausedCredentialHoldsItsBatches: a credential paused by a spend cap (as the
// executor pauses it) sends no provider batch: its batch-lane job keeps waiting, while another
// credential's lane goes on; after the operator resumes it, the job goes in a batch.
func TestBatchLane_PausedCredentialHoldsItsBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{extra: "batch: { enabled: true, max_wait_to_fill: 50ms, poll_interval: 100ms }",
		backup: "batch: { enabled: true, max_wait_to_fill: 1s, poll_interval: 100ms }"})
	pool, err := openPool(b.ctx, b.dbURL)
	require.NoError(t, err)
	defer pool.Close()
	pauses, gate := credpause.NewStore(pool, nil), b.limiterCredential(t, "default")
	started, err := pauses.Pause(b.ctx, gate, "rate_limited_no_retry_after", "job-1")
	require.NoError(t, err)
	require.True(t, started)

	held := b.submit(t, `{"lane":"batch",`+anthropicBody("held")[1:])
	other := b.submit(t, `{"lane":"batch","credential":"backup",`+anthropicBody("not paused")[1:])
	// The pass that sent backup's batch (its job had waited its 1s to fill) collected the default
	// credential's lane first, its job having waited longer than its 50ms.
	job := b.waitTerminal(t, other)
	require.Equal(t, "succeeded", job["status"], "%v", job["last_error"])
	require.Equal(t, "batch", job["cost_class"])
	r := b.do(t, http.MethodGet, "/v1/jobs/"+held, "", nil)
	require.Equal(t, "queued", r.body["status"], "the paused credential's job was sent: %v", r.body)
	require.Equal(t, "waiting", r.body["batch_state"])
	require.Zero(t, b.sim.BatchStats().Created, "the paused credential sent a batch")

	resumed, err := pauses.Resume(b.ctx, gate)
	require.NoError(t, err)
	require.True(t, resumed)
	job = b.waitTerminal(t, held)
	require.Equal(t, "succeeded", job["status"], "%v", job["last_error"])
	require.Equal(t, "batch", job["cost_class"])
	require.Equal(t, 1, b.sim.BatchStats().Created)
}
