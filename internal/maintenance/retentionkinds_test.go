package maintenance_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logtest"
	"github.com/llmq/llmq/internal/maintenance"
	"github.com/llmq/llmq/internal/tenant"
)

// TestMaintainer_RetentionKindsFailOnTheirOwn: a kind whose delete fails every time (a trigger
// refusing the deletion of succeeded jobs, as a statement timeout on a huge backlog would) stops
// only itself: the pass still deletes the other statuses' jobs, the ended provider batches, the
// audit log's entries and the rotated-out tokens, and its error (logged, and counted as a failed
// pass) names the kind that failed. The pass ended at the first failing kind, so the later ones
// waited for a pass that never came while it kept failing.
func TestMaintainer_RetentionKindsFailOnTheirOwn(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	var logs logtest.Buffer
	b, m := setup(t, maintenance.Config{Interval: 20 * time.Millisecond, RetentionInterval: 20 * time.Millisecond,
		RetentionBatch: 2, BatchPause: time.Millisecond, AuditRetention: 365 * day,
		Retention: map[jobs.Status]time.Duration{jobs.StatusSucceeded: 7 * day, jobs.StatusFailed: 7 * day,
			jobs.StatusDead: 7 * day},
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := t.Context()
	count := func(query string) int {
		t.Helper()
		var n int
		require.NoError(t, b.Pool.QueryRow(ctx, query).Scan(&n))
		return n
	}
	// Given expired jobs of three statuses (the first one's more than a batch), an ended
	// provider batch holding no job, audit entries and a rotated-out token past the year,
	var succeeded []string
	for range 3 {
		id := b.Finished(t, jobs.StatusSucceeded, "")
		b.FinishedAgo(t, id, 8*day)
		succeeded = append(succeeded, id)
	}
	for _, s := range []jobs.Status{jobs.StatusFailed, jobs.StatusDead} {
		b.FinishedAgo(t, b.Finished(t, s, ""), 8*day)
	}
	_, err := b.Pool.Exec(ctx, `INSERT INTO provider_batches (id, credential, model, state, provider_batch_id, ended_at)
VALUES (gen_random_uuid(), 'default', 'm', 'ended', 'msgbatch_ended', now() - interval '2 days')`)
	require.NoError(t, err)
	for range 3 {
		e, err := audit.Log(ctx, b.Pool, audit.Entry{Operator: "ctl:root", Action: "expired"})
		require.NoError(t, err)
		_, err = b.Pool.Exec(ctx, `UPDATE audit_log SET at = at - interval '400 days' WHERE id = $1`, e.ID)
		require.NoError(t, err)
	}
	tenants := tenant.NewStore(b.Pool, nil)
	_, _, err = tenants.Create(ctx, "acme", nil)
	require.NoError(t, err)
	_, err = tenants.Rotate(ctx, "acme", 0)
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, `UPDATE tenant_previous_tokens
SET rotated_at = now() - interval '400 days', expires_at = now() - interval '400 days'`)
	require.NoError(t, err)
	// and Postgres refusing to delete a succeeded job, the first kind the pass deletes,
	_, err = b.Pool.Exec(ctx, `CREATE FUNCTION refuse_succeeded_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'injected: succeeded jobs cannot be deleted';
END $$;
CREATE TRIGGER refuse_succeeded_delete BEFORE DELETE ON jobs FOR EACH ROW
WHEN (OLD.status = 'succeeded') EXECUTE FUNCTION refuse_succeeded_delete()`)
	require.NoError(t, err)

	// DeleteExpired deletes the other statuses and the ended batch, and says which kind failed.
	deleted, err := m.DeleteExpired(ctx)
	require.ErrorContains(t, err, "delete expired succeeded jobs")
	require.ErrorContains(t, err, "injected: succeeded jobs cannot be deleted")
	require.Equal(t, map[jobs.Status]int64{jobs.StatusSucceeded: 0, jobs.StatusFailed: 1, jobs.StatusDead: 1}, deleted)
	require.Equal(t, 3, count(`SELECT count(*) FROM jobs`), "the succeeded jobs stay")
	require.Zero(t, count(`SELECT count(*) FROM provider_batches`), "the ended batch went")

	// The leader's pass, failing on the succeeded jobs every time, still deletes the audit
	// entries and the rotated-out token,
	runLeading(t, m)
	require.Eventually(t, func() bool { // on testify's goroutine: no require here
		var entries, tokens int
		err := b.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM audit_log), (SELECT count(*) FROM tenant_previous_tokens)`).
			Scan(&entries, &tokens)
		return err == nil && entries == 0 && tokens == 0
	}, 30*time.Second, 20*time.Millisecond, "audit entries and rotated-out tokens deleted")
	// and counts as failed, its log naming the kind that failed.
	require.Eventually(t, func() bool {
		return metric(t, b.reg, "llmq_maintenance_failed_passes_in_a_row", map[string]string{"pass": "retention"}) >= 1
	}, 30*time.Second, 20*time.Millisecond, "the pass counted as failed")
	require.Contains(t, logs.String(), "delete expired succeeded jobs")
	for _, id := range succeeded {
		require.Equal(t, 1, b.Rows(t, id)["jobs"], "job %s stays", id)
	}
}
