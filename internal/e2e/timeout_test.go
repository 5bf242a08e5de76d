package e2e_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

func TestTimeouts_FirstByteIsItsOwnClass(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{sim: llmsim.Config{Faults: llmsim.Faults{SlowFirstByte: 5 * time.Second}}})

	// Given a provider that sends headers at once and no body for 5 s, when a job allows 100 ms
	// to the first body byte, then each attempt ends as a timeout (not an error) and is retried.
	id := b.submit(t, `{"max_attempts":2,"first_byte_timeout":"100ms","request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"slow"}]}}`)
	job := b.waitTerminal(t, id)
	require.Equal(t, "dead", job["status"])
	require.Equal(t, "retries_exhausted", job["dead_reason"])
	require.EqualValues(t, 2, job["attempts"])
	require.Equal(t, "timeout", job["last_error"].(map[string]any)["class"])
	require.Equal(t, "100ms", job["first_byte_timeout"])
	var timeouts int
	b.queryRow(t, "SELECT count(*) FROM job_attempts WHERE job_id = $1 AND class = 'timeout'", []any{id}, &timeouts)
	require.Equal(t, 2, timeouts)

	// After the timeouts, an error-class retry is still possible (its budget is separate).
	require.NoError(t, b.sim.SetFaults(llmsim.Faults{FailNext: 1, FailNextStatus: 503}))
	id = b.submit(t, anthropicBody("fast again"))
	job = b.waitTerminal(t, id)
	require.Equal(t, "succeeded", job["status"])
	require.EqualValues(t, 2, job["attempts"])
}

func TestSubmit_AttemptTimeoutsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true})
	for _, body := range []string{
		`{"request":{"model":"m"},"first_byte_timeout":"soon"}`,
		`{"request":{"model":"m"},"attempt_timeout":"-1s"}`,
		`{"request":{"model":"m"},"timeout":"1m","attempt_timeout":"2m"}`,
	} {
		r := b.do(t, "POST", "/v1/jobs", body, nil)
		require.Equal(t, 400, r.status, body)
		require.Equal(t, "invalid_timeout", r.body["error"].(map[string]any)["type"])
	}
}
