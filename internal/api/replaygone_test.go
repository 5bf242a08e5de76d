package api

import (
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestSubmit_KeyWhoseJobKeepsVanishingIs503: a keyed submit whose key's job was deleted before
// it was read, under each of the store's tries (jobs.ErrKeyBusy: retention or a purge deleting,
// again and again, the job another submit of the key creates meanwhile), stored nothing, and its
// next try likely takes: it is answered 503 job_busy with Retry-After, not 500 internal. The
// injection: the key's job deleted with its foreign keys off, so that the key stays and every
// try finds it holding a job that is not there.
func TestSubmit_KeyWhoseJobKeepsVanishingIs503(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	body := `{"request":{"model":"m","max_tokens":5}}`
	key := map[string]string{"Idempotency-Key": "vanishing"}
	first := b.do(t, http.MethodPost, "/v1/jobs", body, key)
	require.Equal(t, http.StatusAccepted, first.status, "%v", first.body)
	require.NoError(t, pgx.BeginFunc(t.Context(), b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(t.Context(), `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		_, err := tx.Exec(t.Context(), `DELETE FROM jobs WHERE id = $1`, first.body["id"])
		return err
	}))

	again := b.do(t, http.MethodPost, "/v1/jobs", body, key)
	require.Equal(t, http.StatusServiceUnavailable, again.status, "%v", again.body)
	require.Equal(t, "job_busy", again.body["error"].(map[string]any)["type"])
	require.Equal(t, "1", again.header.Get("Retry-After"))
	var n int
	require.NoError(t, b.pool.QueryRow(t.Context(), `SELECT count(*) FROM jobs`).Scan(&n))
	require.Zero(t, n, "nothing stored")
}
