package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCreate_KeyedCommitInFlightWhenItsConnectionBrokeAnswersItsJob: a keyed submit whose
// connection broke while its commit was on its way (sent, not yet applied: a network drop in
// front of a server that still gets it) answers the job once that commit lands. Its read-back
// by job ID ran before the commit and answered the failure (the API's 503, "not stored"; a serve
// process dropped the first attempt its insert had started) for a job stored a moment later.
// The read-back claims the key instead, as Replay does: the claim waits for the in-flight
// transaction to commit or roll back, and so learns which.
func TestCreate_KeyedCommitInFlightWhenItsConnectionBrokeAnswersItsJob(t *testing.T) {
	t.Parallel()
	s, cutter, direct := newCutStore(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := CreateParams{Tenant: "default", Credential: "c", IdempotencyKey: "in-doubt", Fingerprint: "f",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour}

	hold, done := createAtHeldCommit(ctx, t, s, cutter, p)
	// The client's connection breaks; the proxy still holds the commit for the server, which
	// stays reachable (Cut and Restore would refuse a read-back that reconnected in between).
	cutter.Reset()
	var r createResult
	answered := false
	for !answered {
		select {
		case r = <-done:
			answered = true
		case <-ctx.Done():
			t.Fatal("the keyed create neither answered nor waited for its key")
		case <-time.After(5 * time.Millisecond):
		}
		if answered {
			break
		}
		var waiting int
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting))
		if waiting > 0 {
			break // the read-back waits for the in-flight transaction
		}
	}
	hold.Release() // the commit reaches the server
	if !answered {
		select {
		case r = <-done:
		case <-ctx.Done():
			t.Fatal("the keyed create did not return once its commit landed")
		}
	}
	// The commit lands (whatever the create answered): the key is the job's.
	var stored string
	require.Eventually(t, func() bool {
		return direct.QueryRow(ctx, `SELECT job_id::text FROM idempotency_keys WHERE key = 'in-doubt'`).Scan(&stored) == nil
	}, 30*time.Second, 5*time.Millisecond, "the held commit never landed")
	require.NoError(t, r.err, "the commit took effect: its job is the answer")
	require.Equal(t, stored, r.job.ID)
	require.Equal(t, StatusQueued, r.job.Status)
	require.JSONEq(t, `{"model":"m"}`, string(r.job.Request))
	requireStored(t, direct, 1, 1)
}
