package api

import (
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestSubmit_ReadOnlyPostgresIsUnavailable: during a Postgres failover a connection can land on a
// server that refuses writes (a standby not yet promoted, or one set
// default_transaction_read_only): SQLSTATE 25006. A submit then cannot be stored, and trying
// again shortly can succeed: the answer is 503 with Retry-After, as for a Postgres that cannot be
// reached, not a 500 that tells the client the request itself broke something.
func TestSubmit_ReadOnlyPostgresIsUnavailable(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	conn, err := pgx.Connect(t.Context(), dbURL)
	require.NoError(t, err)
	_, err = conn.Exec(t.Context(), `DO $$ BEGIN
		EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', current_database()); END $$`)
	require.NoError(t, err)
	require.NoError(t, conn.Close(t.Context()))
	b := setup(t, setupOpts{dbURL: dbURL, noListener: true}) // its connections are new: read-only

	for _, header := range []map[string]string{nil, {"Idempotency-Key": "read-only"}} {
		r := b.do(t, http.MethodPost, "/v1/jobs", `{"request":{"model":"m","max_tokens":5}}`, header)
		require.Equal(t, http.StatusServiceUnavailable, r.status, "%v", r.body)
		require.Equal(t, "unavailable", r.body["error"].(map[string]any)["type"])
		require.NotEmpty(t, r.header.Get("Retry-After"))
	}
}
