package batchlane

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestStore_BatchJobsInUUIDOrder: a batch's jobs are read (store.jobs, for its record) and sent
// (store.beginSend, the batch file's lines) in the order of their ids as uuids, whatever the
// database's collation. Ordered by the ids' text (the output column id::text was ORDER BY's
// "id"), a database whose collation compares runs of digits by their value (an ICU locale with
// kn: "9a" before "10a") sent them in another order than one of the server's default, and
// sorted them through the collation.
func TestStore_BatchJobsInUUIDOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	pool := pgtest.ICUPool(ctx, t, "und-u-kn")
	var batch string
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO provider_batches (id, credential, model, state)
VALUES (gen_random_uuid(), 'c', 'm', 'committed') RETURNING id::text`).Scan(&batch))
	_, err := pool.Exec(ctx, `INSERT INTO jobs (id, tenant, credential, fingerprint, status, request, max_attempts,
	timeout_ms, deadline, lane, batch_ref)
SELECT (g || 'a' || repeat('0', 31 - length(g::text)))::uuid, 't', 'c', 'f', 'queued', '{}', 3, 60000,
	now() + interval '1 hour', 'batch', $1
FROM generate_series(1, 64) g`, batch) // ids 1a000000-..., 10a00000-..., 9a000000-...: text and uuid orders differ
	require.NoError(t, err)
	var natural bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT '9a'::text < '10a'::text`).Scan(&natural))
	require.True(t, natural, "the database compares digits by their value")
	// Canonical uuids' text (lowercase hex, fixed width) compares in Go as their bytes do.
	s := store{pool: pool}

	jobs, err := s.jobs(ctx, batch)
	require.NoError(t, err)
	ids := make([]string, len(jobs))
	for i, j := range jobs {
		ids[i] = j.ID
	}
	require.Len(t, ids, 64)
	require.True(t, slices.IsSorted(ids), "the batch's jobs in uuid order: %q", ids[:12])

	reqs, _, _, err := s.beginSend(ctx, batch, time.Now(), time.Now().Add(time.Minute))
	require.NoError(t, err)
	sent := make([]string, len(reqs))
	for i, r := range reqs {
		sent[i] = r.CustomID
	}
	require.Equal(t, ids, sent, "the batch file's lines in uuid order")
}
