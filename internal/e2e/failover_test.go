package e2e_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
)

func TestFailover(t *testing.T) {
	t.Parallel()

	t.Run("RetryableErrorMovesToTheFallback", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{sim: llmsim.Config{Faults: llmsim.Faults{FailNext: 100, FailNextStatus: 529}}})

		id := b.submit(t, `{"fallbacks":["backup"],"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}}`)
		job := b.waitTerminal(t, id)

		require.Equal(t, "succeeded", job["status"])
		require.Equal(t, "backup", job["answered_by"])
		require.Equal(t, []any{"backup"}, job["fallbacks"])
		require.EqualValues(t, 2, job["attempts"])
		require.Equal(t, 1, b.sim.Stats().Requests)
		require.Equal(t, 1, b.backup.Stats().Requests)
	})

	t.Run("BadRequestNeverTouchesTheFallback", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{})

		id := b.submit(t, `{"fallbacks":["backup"],"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"`+llmsim.DefaultBadRequestMarker+`"}]}}`)
		job := b.waitTerminal(t, id)

		require.Equal(t, "failed", job["status"])
		require.Nil(t, job["answered_by"])
		require.Equal(t, 1, b.sim.Stats().Requests)
		require.Zero(t, b.backup.Stats().Requests)
	})

	t.Run("SubmitValidatesFallbacks", func(t *testing.T) {
		t.Parallel()
		b := setup(t, setupOpts{noWorker: true})
		for body, typ := range map[string]string{
			`{"fallbacks":["oai"],"request":{"model":"m"}}`:             "invalid_fallbacks", // another wire format
			`{"fallbacks":["nope"],"request":{"model":"m"}}`:            "unknown_credential",
			`{"fallbacks":["backup","backup"],"request":{"model":"m"}}`: "invalid_fallbacks",
			`{"fallbacks":["default"],"request":{"model":"m"}}`:         "invalid_fallbacks",
			`{"fallbacks":"backup","request":{"model":"m"}}`:            "invalid_field",
		} {
			r := b.do(t, http.MethodPost, "/v1/jobs", body, nil)
			require.Equal(t, http.StatusBadRequest, r.status, body)
			require.Equal(t, typ, r.body["error"].(map[string]any)["type"], body)
		}
	})
}

func TestFailover_OpenBreakerMovesOnWithoutCallingThePrimary(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{
		sim: llmsim.Config{Faults: llmsim.Faults{FailNext: 100, FailNextStatus: 529}},
		top: "breaker: { threshold: 1, cooldown: 1m }",
	})
	// One failure opens the primary's breaker.
	first := b.submit(t, `{"max_attempts":1,"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]}}`)
	require.Equal(t, "dead", b.waitTerminal(t, first)["status"])

	// A job with a fallback does not wait out the cooldown: it moves to the fallback at once.
	id := b.submit(t, `{"fallbacks":["backup"],"request":{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"y"}]}}`)
	job := b.waitTerminal(t, id)
	require.Equal(t, "succeeded", job["status"])
	require.Equal(t, "backup", job["answered_by"])
	require.EqualValues(t, 1, job["attempts"])
	require.Equal(t, 1, b.sim.Stats().Requests)
}
