package api

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSubmit_ReplayOutlivesAConfigChange: a replay (the same Idempotency-Key and body) answers
// 200 with the key's job even when the replica answering it would refuse the body as a new
// submit, because its configuration changed since (a rolling deploy that turns a credential's
// batch lane off, or drops a fallback credential). A 4xx would tell the client, whose first
// answer was lost, that nothing was stored, while its job exists and is paid for. A body that
// differs, or a key never used, still gets the refusal.
func TestSubmit_ReplayOutlivesAConfigChange(t *testing.T) {
	t.Parallel()
	before := setup(t, setupOpts{credentials: []string{"default", "backup"},
		batchWindows: map[string]time.Duration{"default": time.Hour}})
	after := setup(t, setupOpts{dbURL: before.dbURL, credentials: []string{"default"}})

	for _, tc := range []struct {
		name, body, other, refusal string
	}{
		{"BatchLaneTurnedOff", `{"lane":"batch","request":{"model":"m","max_tokens":5}}`,
			`{"lane":"batch","request":{"model":"m","max_tokens":6}}`, "batch_unavailable"},
		{"FallbackRemoved", `{"fallbacks":["backup"],"request":{"model":"m","max_tokens":5}}`,
			`{"fallbacks":["backup"],"request":{"model":"m","max_tokens":6}}`, "unknown_credential"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := map[string]string{"Idempotency-Key": "config-" + tc.name}
			first := before.do(t, http.MethodPost, "/v1/jobs", tc.body, key)
			require.Equal(t, http.StatusAccepted, first.status, "%v", first.body)
			id := first.body["id"].(string)

			again := after.do(t, http.MethodPost, "/v1/jobs", tc.body, key)
			require.Equal(t, http.StatusOK, again.status, "a replay answers its job: %v", again.body)
			require.Equal(t, id, again.body["id"])
			require.Equal(t, "true", again.header.Get("Idempotent-Replayed"))
			require.Equal(t, "/v1/jobs/"+id, again.header.Get("Location"))

			// Another body with the key, or the body under a new key: the refusal.
			for _, r := range []response{
				after.do(t, http.MethodPost, "/v1/jobs", tc.other, key),
				after.do(t, http.MethodPost, "/v1/jobs", tc.body, map[string]string{"Idempotency-Key": "new-" + tc.name}),
				after.do(t, http.MethodPost, "/v1/jobs", tc.body, nil),
			} {
				require.Equal(t, http.StatusBadRequest, r.status, "%v", r.body)
				require.Equal(t, tc.refusal, r.body["error"].(map[string]any)["type"])
			}
		})
	}
	var n int
	require.NoError(t, before.pool.QueryRow(t.Context(), `SELECT count(*) FROM jobs`).Scan(&n))
	require.Equal(t, 2, n, "one job per key, nothing stored for a refusal")
}
