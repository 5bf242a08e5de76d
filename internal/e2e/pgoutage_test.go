package e2e_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestChaos_PostgresOutage cuts Postgres off (every connection reset, new ones refused) under
// jobs in progress and submits: the API answers 503 with Retry-After, never 500 and never 202 for
// a job it did not store; once Postgres is back, every job it accepted succeeds and what it
// refused was not stored (resubmitting with the same Idempotency-Key makes a new job).
func TestChaos_PostgresOutage(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{pgProxy: true})
	body := `{"request":{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"outage"}]}}`
	var accepted []string
	for range 10 {
		accepted = append(accepted, b.submit(t, body))
	}

	b.pg.Cut()
	var refused []string
	for i := range 10 {
		key := fmt.Sprintf("pg-outage-%d", i)
		r := b.do(t, http.MethodPost, "/v1/jobs", body, map[string]string{"Idempotency-Key": key})
		switch r.status {
		case http.StatusAccepted:
			accepted = append(accepted, r.body["id"].(string))
		case http.StatusServiceUnavailable:
			require.NotEmpty(t, r.header.Get("Retry-After"), "503 without Retry-After: %v", r.body)
			refused = append(refused, key)
		default:
			t.Fatalf("submit during the outage answered %d: %v", r.status, r.body)
		}
	}
	require.NotEmpty(t, refused, "the outage was not felt: every submit was accepted")
	b.pg.Restore()

	for _, id := range accepted {
		require.Equal(t, "succeeded", b.waitTerminal(t, id)["status"], "job %s", id)
	}
	for _, key := range refused {
		r := b.do(t, http.MethodPost, "/v1/jobs", body, map[string]string{"Idempotency-Key": key})
		require.Equal(t, http.StatusAccepted, r.status, "a refused submit was stored after all (key %s): %v", key, r.body)
		require.Equal(t, "succeeded", b.waitTerminal(t, r.body["id"].(string))["status"])
	}
}
