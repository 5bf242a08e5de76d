package jobs

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// TestCreate_KeyedCommitAnswerLostAnswersItsJob: a keyed submit whose commit took effect but
// whose answer was lost (a Postgres failover, a dropped connection) answers the job it stored,
// new, as a keyless one does (TestCreate_AloneWhoseCommitAnswerIsLostAnswersItsJob): it failed
// as unavailable (the API's 503, "not stored") while its job was stored and would run, and a
// serve process dropped the first attempt its insert had started. The client's resend under
// the key replays that job.
func TestCreate_KeyedCommitAnswerLostAnswersItsJob(t *testing.T) {
	t.Parallel()
	s, cutter, direct := newCutStore(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := CreateParams{Tenant: "default", Credential: "c", IdempotencyKey: "lost", Fingerprint: "f",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour}

	hold, done := createAtHeldCommit(ctx, t, s, cutter, p)
	cutter.LoseNextAnswer()
	hold.Release()
	var r createResult
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the keyed create did not return")
	}
	require.NoError(t, r.err, "the commit took effect: its job is the answer")
	require.Equal(t, StatusQueued, r.job.Status)
	require.JSONEq(t, `{"model":"m"}`, string(r.job.Request))
	require.Equal(t, 1, cutter.LostAnswers())
	requireStored(t, direct, 1, 1)

	job, replayed, err := s.Create(ctx, p)
	require.NoError(t, err)
	require.True(t, replayed, "the resend under the key answers the stored job")
	require.Equal(t, r.job.ID, job.ID)
	requireStored(t, direct, 1, 1)
	var keyJob string
	require.NoError(t, direct.QueryRow(ctx, `SELECT job_id::text FROM idempotency_keys WHERE key = 'lost'`).Scan(&keyJob))
	require.Equal(t, keyJob, job.ID)
}

// createResult is what a Create run in the background answered.
type createResult struct {
	job *Job
	err error
}

// createAtHeldCommit runs s.Create(ctx, p) in the background and returns once the proxy holds
// its commit (hold: released at the test's end at the latest), with the channel of its answer.
func createAtHeldCommit(ctx context.Context, t *testing.T, s *Store, cutter *pgtest.Proxy, p CreateParams) (*pgtest.Hold, <-chan createResult) {
	t.Helper()
	hold := cutter.HoldStatement("commit")
	t.Cleanup(hold.Release)
	done := make(chan createResult, 1)
	go func() {
		job, _, err := s.Create(ctx, p)
		done <- createResult{job, err}
	}()
	select {
	case <-hold.Reached():
	case <-ctx.Done():
		t.Fatal("the keyed create never reached its commit")
	}
	return hold, done
}
