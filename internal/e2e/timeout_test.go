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

// TestTimeouts_StalledStreamIsResetAndRetried: a streaming job whose stream stalls after its
// first deltas held its worker slot until attempt_timeout (5m). With the credential's
// stall_timeout set, the attempt ends as a timeout: the client sees the reset of the deltas that
// went and the retry, whose stream is the stored result, as for any retryable mid-stream failure.
func TestTimeouts_StalledStreamIsResetAndRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{noWorker: true, extra: "stall_timeout: 200ms",
		sim: llmsim.Config{ReplyTokens: 20, StreamTokensPerSecond: 1000,
			Faults: llmsim.Faults{StreamFailNext: 1, StreamFailAfter: 5, StreamFailMode: llmsim.StreamFailStall}}})
	id := b.submit(t, `{"request":{"model":"m","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"stall"}]}}`)
	unlinkDeltasAtEnd(t, b.redisURL, id)
	s := openEvents(t, b.apiURL, id, "")
	ev, ok := s.next(t)
	require.True(t, ok)
	require.Equal(t, "queued", ev.name)
	b.startWorker(t)

	evs := s.rest(t)
	var shape []string
	for i, ev := range evs {
		if ev.name != "delta" || i == 0 || evs[i-1].name != "delta" {
			shape = append(shape, ev.name)
		}
	}
	require.Equal(t, []string{"running", "delta", "reset", "retrying", "running", "delta", "succeeded"}, shape)
	requireStreamedResult(t, evs[indexOfName(evs, "reset")+1:])

	var class, msg string
	b.queryRow(t, "SELECT class, error FROM job_attempts WHERE job_id = $1 AND attempt = 1", []any{id}, &class, &msg)
	require.Equal(t, "timeout", class)
	require.Contains(t, msg, "no new answer byte for 200ms after the body began")
}

// indexOfName is the index of the first event named name, or -1.
func indexOfName(evs []sseEvent, name string) int {
	for i, ev := range evs {
		if ev.name == name {
			return i
		}
	}
	return -1
}
