package jobs

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// newCutStore returns a Store whose connections go through a pgtest.Proxy, the proxy, and a
// pool straight to the same database for the test's own reads.
func newCutStore(t *testing.T) (*Store, *pgtest.Proxy, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	dbURL := pgtest.URL(t)
	cutter, viaCutter := pgtest.NewProxy(t, dbURL)
	pool, err := pgxpool.New(ctx, viaCutter)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	direct, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	return NewStore(pool, nil), cutter, direct
}

// inOneBatchWithItsAnswerLost runs calls at once so that their statements wait for one batch (as
// if a batch were out), has cutter lose that batch's answer, sends it, and waits for every call
// to return.
func inOneBatchWithItsAnswerLost(t *testing.T, s *Store, cutter *pgtest.Proxy, calls ...func()) {
	t.Helper()
	// Once the sender of earlier statements has gone, hold its place: the calls' statements queue.
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		if s.batch.inFlight != 0 {
			return false
		}
		s.batch.inFlight = 1
		return true
	}, 30*time.Second, time.Millisecond)
	var wg sync.WaitGroup
	for _, call := range calls {
		wg.Go(call)
	}
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return len(s.batch.pending) == len(calls)
	}, 30*time.Second, time.Millisecond)
	cutter.LoseNextBatchAnswer()
	go s.batch.send() // as the sender that was out would go on to it
	wg.Wait()
	require.Equal(t, 1, cutter.LostAnswers(), "the batch's commit answer was dropped")
}

// requireStored checks that the database holds jobs jobs and events job events in all.
func requireStored(t *testing.T, direct *pgxpool.Pool, jobs, events int) {
	t.Helper()
	var gotJobs, gotEvents int
	require.NoError(t, direct.QueryRow(t.Context(), `SELECT count(*) FROM jobs`).Scan(&gotJobs))
	require.NoError(t, direct.QueryRow(t.Context(), `SELECT count(*) FROM job_events`).Scan(&gotEvents))
	require.Equal(t, jobs, gotJobs, "jobs stored")
	require.Equal(t, events, gotEvents, "job events stored")
}

// requireOwnLease checks that job, as BeginAttempt answered it, is running on its first attempt
// and holds the lease its row holds, and that the row counts one attempt.
func requireOwnLease(t *testing.T, direct *pgxpool.Pool, job *Job) {
	t.Helper()
	require.Equal(t, StatusRunning, job.Status)
	require.Equal(t, 1, job.Attempts)
	require.NotNil(t, job.LeaseToken)
	var attempts int
	var token string
	require.NoError(t, direct.QueryRow(t.Context(), `SELECT attempts, lease_token::text FROM jobs WHERE id = $1`, job.ID).Scan(&attempts, &token))
	require.Equal(t, 1, attempts, "attempts the row counts")
	require.Equal(t, token, *job.LeaseToken, "the lease answered is the one the row holds")
}

var cutTestParams = CreateParams{Tenant: "default", Credential: "c", Request: json.RawMessage(`{"model":"m"}`),
	MaxAttempts: 3, Timeout: time.Hour}

// A batch of creates commits, and the connection drops before the store hears so. The batcher
// runs each create again on its own; each finds the row its first try wrote, and answers with it:
// every submit succeeds, and each job exists once.
func TestCreate_BatchWhoseCommitAnswerIsLostAnswersEachJobOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, cutter, direct := newCutStore(t)

	// When two creates' batch commits and its answer is lost
	var jobs [2]*Job
	var errs [2]error
	inOneBatchWithItsAnswerLost(t, s, cutter,
		func() { jobs[0], _, errs[0] = s.Create(ctx, cutTestParams) },
		func() { jobs[1], _, errs[1] = s.Create(ctx, cutTestParams) })

	// Then both answer with their own job, and each job and its event exist once
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.NotEqual(t, jobs[0].ID, jobs[1].ID, "two creates, two jobs")
	for _, j := range jobs {
		require.Equal(t, StatusQueued, j.Status)
	}
	requireStored(t, direct, 2, 2)
}

// A batch of attempt starts commits, and its answer is lost. Each start run again finds the
// lease its first run took, and answers with it: the attempt is counted once, and the delivery
// goes on to make its call instead of waiting out a lease nobody holds.
func TestBeginAttempt_BatchWhoseCommitAnswerIsLostAnswersEachLeaseOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, cutter, direct := newCutStore(t)
	var ids [2]string
	for i := range ids {
		j, _, err := s.Create(ctx, cutTestParams)
		require.NoError(t, err)
		ids[i] = j.ID
	}

	// When the two jobs' attempt starts go in one batch that commits and whose answer is lost
	var jobs [2]*Job
	var errs [2]error
	inOneBatchWithItsAnswerLost(t, s, cutter,
		func() { jobs[0], errs[0] = s.BeginAttempt(ctx, ids[0]) },
		func() { jobs[1], errs[1] = s.BeginAttempt(ctx, ids[1]) })

	// Then each answers with its running job and its lease, counted and recorded once
	for i, j := range jobs {
		require.NoError(t, errs[i])
		require.Equal(t, ids[i], j.ID)
		requireOwnLease(t, direct, j)
		var running int
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = $1 AND type = 'running'`, ids[i]).Scan(&running))
		require.Equal(t, 1, running)
	}

	// And another delivery still finds the job leased
	_, err := s.BeginAttempt(ctx, ids[0])
	var leased *LeasedError
	require.ErrorAs(t, err, &leased)
}

// A create sent alone commits, and its answer is lost. The store runs it once more on another
// connection, which finds the row the first run wrote: the submit succeeds, with one job.
func TestCreate_AloneWhoseCommitAnswerIsLostAnswersItsJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, cutter, direct := newCutStore(t)

	// When a create's commit answer is lost
	cutter.LoseNextAnswer()
	job, _, err := s.Create(ctx, cutTestParams)

	// Then it answers with its job, which exists once, with one event
	require.NoError(t, err)
	require.Equal(t, 1, cutter.LostAnswers(), "the create's commit answer was dropped")
	require.Equal(t, StatusQueued, job.Status)
	requireStored(t, direct, 1, 1)
}

// An attempt start sent alone commits, and its answer is lost. Run once more, it finds its own
// lease and answers with it: one attempt counted, and the delivery goes on to its call.
func TestBeginAttempt_AloneWhoseCommitAnswerIsLostAnswersItsLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, cutter, direct := newCutStore(t)
	created, _, err := s.Create(ctx, cutTestParams)
	require.NoError(t, err)

	// When the start's commit answer is lost
	cutter.LoseNextAnswer()
	job, err := s.BeginAttempt(ctx, created.ID)

	// Then it answers with the running job and the lease the row holds, counted once
	require.NoError(t, err)
	require.Equal(t, 1, cutter.LostAnswers(), "the start's commit answer was dropped")
	requireOwnLease(t, direct, job)
}

// An attempt's finish commits and its answer is lost; run again (by the batcher, or by the
// executor's record), it finds its attempt recorded and moves nothing more: one retrying event,
// the job on its first fallback (not past it), and the answer "applied", which it was.
func TestFinish_WhoseCommitAnswerIsLostAppliesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, cutter, direct := newCutStore(t)
	p := cutTestParams
	p.Fallbacks = []string{"f1", "f2"}
	created, _, err := s.Create(ctx, p)
	require.NoError(t, err)
	begun, err := s.BeginAttempt(ctx, created.ID)
	require.NoError(t, err)

	cutter.LoseNextAnswer()
	next := time.Now().Add(time.Minute)
	applied, err := s.Finish(ctx, created.ID, &Attempt{Number: 1, Credential: "c", StartedAt: time.Now(),
		Class: "server_error", StatusCode: 503, LeaseToken: *begun.LeaseToken},
		Outcome{Status: StatusRetrying, NextAttemptAt: &next, NextCredential: true,
			LastError: &LastError{Class: "server_error", Message: "x"}})
	require.NoError(t, err)
	require.True(t, applied)
	require.Equal(t, 1, cutter.LostAnswers(), "the finish's commit answer was dropped")

	var credIndex, retrying, seq int
	require.NoError(t, direct.QueryRow(ctx, `SELECT credential_index, event_seq FROM jobs WHERE id = $1`, created.ID).Scan(&credIndex, &seq))
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = $1 AND type = 'retrying'`, created.ID).Scan(&retrying))
	require.Equal(t, 1, retrying, "one retrying event")
	require.Equal(t, 3, seq, "queued, running, retrying")
	require.Equal(t, 1, credIndex, "moved to the first fallback, not past it")

	// The same for a final outcome: the repeat answers applied (its result is the one stored).
	begun, err = s.BeginAttempt(ctx, created.ID)
	require.NoError(t, err)
	cutter.LoseNextAnswer()
	applied, err = s.Finish(ctx, created.ID, &Attempt{Number: 2, Credential: "f1", StartedAt: time.Now(),
		Class: "ok", StatusCode: 200, LeaseToken: *begun.LeaseToken},
		Outcome{Status: StatusSucceeded, Result: []byte(`{"ok":true}`), AnsweredBy: "f1"})
	require.NoError(t, err)
	require.Equal(t, 2, cutter.LostAnswers())
	require.True(t, applied, "this call's outcome is the one stored")
}
