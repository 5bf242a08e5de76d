package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCreate_ReplayOfAJobDeletedMeanwhileMakesANewJob: a replay reads its key without a lock (so
// that replays of one key do not wait for one another), so retention or a purge can delete the
// key's job (and, by cascade, the key) between the key's read and the job's. The submit then
// claims the key anew and makes a new job, as a submit after the deletion would, instead of
// failing as "no job with that id".
func TestCreate_ReplayOfAJobDeletedMeanwhileMakesANewJob(t *testing.T) {
	t.Parallel()
	s, cutter, direct := newCutStore(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := CreateParams{Tenant: "default", Credential: "c", IdempotencyKey: "k", Fingerprint: "f",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour}

	first, replayed, err := s.Create(ctx, p)
	require.NoError(t, err)
	require.False(t, replayed)

	hold := cutter.HoldStatement(` FROM jobs WHERE id = $1`)
	type result struct {
		job      *Job
		replayed bool
		err      error
	}
	done := make(chan result, 1)
	go func() {
		job, replayed, err := s.Create(ctx, p)
		done <- result{job, replayed, err}
	}()
	select {
	case <-hold.Reached():
	case <-ctx.Done():
		t.Fatal("the replay never read its job")
	}
	_, err = direct.Exec(ctx, `DELETE FROM jobs WHERE id = $1`, first.ID)
	require.NoError(t, err)
	hold.Release()

	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the submit did not return")
	}
	require.NoError(t, r.err)
	require.False(t, r.replayed, "the key's job is gone: a new one is made")
	require.NotEqual(t, first.ID, r.job.ID)
	var keyJob string
	require.NoError(t, direct.QueryRow(ctx, `SELECT job_id::text FROM idempotency_keys WHERE key = 'k'`).Scan(&keyJob))
	require.Equal(t, r.job.ID, keyJob)
}
