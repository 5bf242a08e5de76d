package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestMigration022_AttemptUsageBesideTheLastRelease upgrades a database of the last release (021)
// holding an attempt: the attempt is kept, its usage NULL, and an attempt recorded as a process
// of the last release records one (naming no usage) still goes in beside one that names it. Its
// down drops the column and keeps the attempts.
func TestMigration022_AttemptUsageBesideTheLastRelease(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dbURL, _, conn := migrated(ctx, t)
	rollBack(ctx, t, conn, 21)
	const id = "0190a5b2-7c1e-7d3f-9a8b-123456789abc"
	_, err := conn.Exec(ctx, `INSERT INTO jobs (id, credential, fingerprint, status, request, max_attempts, timeout_ms, deadline)
VALUES ($1, 'default', 'f', 'canceled', '{}', 3, 60000, now() + interval '1 minute')`, id)
	require.NoError(t, err)
	// The last release's Finish names these columns.
	lastRelease := `INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, ttfb_ms, status_code,
	class, retry_after_ms, delay_ms, error) VALUES ($1, $2, 'default', now(), 12.5, NULL, 200, 'ok', NULL, NULL, NULL)`
	_, err = conn.Exec(ctx, lastRelease, id, 1)
	require.NoError(t, err)

	migrateUp(ctx, t, dbURL)
	_, err = conn.Exec(ctx, lastRelease, id, 2)
	require.NoError(t, err, "a process of the last release records its attempts")
	_, err = conn.Exec(ctx, `INSERT INTO job_attempts (job_id, attempt, credential, started_at, latency_ms, class, usage)
VALUES ($1, 3, 'default', now(), 1, 'ok', '{"input_tokens": 3, "output_tokens": 5}')`, id)
	require.NoError(t, err)
	rows, err := conn.Query(ctx, `SELECT attempt, usage FROM job_attempts WHERE job_id = $1 ORDER BY attempt`, id)
	require.NoError(t, err)
	type row struct {
		Attempt int
		Usage   map[string]any
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Equal(t, []row{{1, nil}, {2, nil}, {3, map[string]any{"input_tokens": 3.0, "output_tokens": 5.0}}}, got)

	rollBack(ctx, t, conn, 21)
	var n int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM job_attempts WHERE job_id = $1`, id).Scan(&n))
	require.Equal(t, 3, n, "the attempts are kept")
	_, err = conn.Exec(ctx, lastRelease, id, 4)
	require.NoError(t, err)
}
