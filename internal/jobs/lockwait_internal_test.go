package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// lockedRowSetup is a store with two running jobs, a and b, and a transaction of another
// session (a cancel whose client went silent, an operator's psql) that holds a's row locked
// until the test ends or calls the returned unlock.
func lockedRowSetup(t *testing.T) (s *Store, direct *pgxpool.Pool, a, b *Job, unlock func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dbURL := pgtest.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	direct, err = pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	s = NewStore(pool, nil)
	jobs := make([]*Job, 2)
	for i := range jobs {
		created, _, err := s.Create(ctx, cutTestParams)
		require.NoError(t, err)
		jobs[i], err = s.BeginAttempt(ctx, created.ID)
		require.NoError(t, err)
	}
	tx, err := direct.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, jobs[0].ID)
	require.NoError(t, err)
	unlock = func() { _ = tx.Rollback(context.Background()) }
	t.Cleanup(unlock)
	return s, direct, jobs[0], jobs[1], unlock
}

// waitingForLock waits until some statement of the database waits for a row lock.
func waitingForLock(t *testing.T, direct *pgxpool.Pool) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		err := direct.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n)
		return err == nil && n > 0
	}, 20*time.Second, 10*time.Millisecond, "a statement waits for the row lock")
}

// succeeded is a success outcome of job's attempt.
func succeeded(job *Job) (*Attempt, Outcome) {
	return &Attempt{Number: job.Attempts, Credential: "c", StartedAt: time.Now(), LeaseToken: *job.LeaseToken},
		Outcome{Status: StatusSucceeded, Result: json.RawMessage(`{"ok":true}`), AnsweredBy: "c"}
}

// A job row another session holds locked for long (a transaction whose client fell
// silent keeps its lock until Postgres notices, up to TCP's keepalive: hours) stalled every
// transition of the process: the store sends one batch at a time, and the statement waiting for
// the lock held it for the batch's 30 s, every other job's outcome queued behind it until the
// callers gave up (the worker's record after its own 30 s: the delivery failed, and its answer,
// paid for, was lost; the job called again). The lock wait is bounded now (batchLockTimeout):
// the locked job's statement answers lock_not_available, unavailable, and the others go on.
func TestStore_LockedRowDoesNotHoldOtherJobsTransitions(t *testing.T) {
	t.Parallel()
	s, direct, a, b, unlock := lockedRowSetup(t)

	// When a's outcome waits for its row lock
	type result struct {
		applied bool
		err     error
	}
	aDone := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		at, o := succeeded(a)
		applied, err := s.Finish(ctx, a.ID, at, o)
		aDone <- result{applied, err}
	}()
	waitingForLock(t, direct)

	// Then b's outcome is stored within a few seconds (it waited 30 s before)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	bt, bo := succeeded(b)
	applied, err := s.Finish(ctx, b.ID, bt, bo)
	require.NoError(t, err, "b's outcome, while a's row is locked")
	require.True(t, applied)

	// And a's answers lock_not_available (unavailable: the worker's record tries again), not
	// stored
	var r result
	select {
	case r = <-aDone:
	case <-time.After(30 * time.Second):
		t.Fatal("a's outcome still waits for its row lock")
	}
	var pgErr *pgconn.PgError
	require.ErrorAs(t, r.err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code)
	require.True(t, IsUnavailable(r.err))
	require.False(t, r.applied)

	// And once the lock is released, a's outcome is stored
	unlock()
	at, o := succeeded(a)
	applied, err = s.Finish(context.Background(), a.ID, at, o)
	require.NoError(t, err)
	require.True(t, applied)
	for _, j := range []*Job{a, b} {
		got, err := s.Get(context.Background(), j.ID)
		require.NoError(t, err)
		require.Equal(t, StatusSucceeded, got.Status)
	}
	// And the bound was the batch's own: the pool's sessions keep theirs
	var setting string
	require.NoError(t, s.pool.QueryRow(context.Background(), `SELECT current_setting('lock_timeout')`).Scan(&setting))
	require.Equal(t, "0", setting)
}

// In a batch, the statement that waited for a locked row past the bound answers its
// lock_not_available at once, without a second wait alone; the batch's other statements, rolled
// back with it, run again alone and are stored.
func TestBatcher_LockedRowFailsAloneInABatch(t *testing.T) {
	t.Parallel()
	s, _, a, b, _ := lockedRowSetup(t)
	ops := make([]*batchOp, 0, 2)
	applied := map[string]*bool{}
	runs := map[string]*int{}
	for _, j := range []*Job{a, b} {
		at, o := succeeded(j)
		var seq int
		ok := new(bool)
		applied[j.ID] = ok
		n := new(int)
		runs[j.ID] = n
		sql := `UPDATE jobs SET status = $2, lease_token = NULL, lease_until = NULL, finished_at = now(),
			event_seq = event_seq + 1 WHERE id = $1 AND lease_token = $3::uuid RETURNING event_seq`
		ops = append(ops, &batchOp{ctx: context.Background(), key: j.ID, sql: sql,
			args: []any{j.ID, o.Status, at.LeaseToken}, done: make(chan struct{}),
			scan: scanFunc(func(r pgx.Row) error {
				*n++
				err := r.Scan(&seq)
				*ok = err == nil
				return err
			})})
	}
	s.batch.run(ops)
	// One lock wait, not two (the batch's, then a's alone again): a's statement was read once.
	require.Equal(t, 1, *runs[a.ID], "a's statement runs")

	// Ended by the lock's bound (lock_not_available), not by the batch's (a context's end).
	var pgErr *pgconn.PgError
	require.ErrorAs(t, ops[0].err, &pgErr, "a's statement")
	require.Equal(t, "55P03", pgErr.Code)
	require.NoError(t, ops[1].err, "b's statement")
	require.True(t, *applied[b.ID])
}

// A batch whose statement waits for a locked row past the bound rolls back whole: the
// statements before it in the pipeline (a finish, a keyless create, which had answered) as well
// as those after it, which Postgres skipped. None of them took effect, and run applies each
// again alone exactly once: no create lost or doubled, no attempt or event recorded twice.
func TestBatcher_LockTimedOutBatchRollsBackItsNeighboursAndRunsThemOnce(t *testing.T) {
	t.Parallel()
	s, direct, a, b, _ := lockedRowSetup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The real statements of b's and a's finishes, queued while the batcher is held busy.
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		if s.batch.inFlight != 0 {
			return false
		}
		s.batch.inFlight = batchInFlight
		return true
	}, 30*time.Second, time.Millisecond)
	type finished struct {
		applied bool
		err     error
	}
	results := map[string]chan finished{a.ID: make(chan finished, 1), b.ID: make(chan finished, 1)}
	for _, j := range []*Job{b, a} {
		at, o := succeeded(j)
		go func() {
			applied, err := s.Finish(ctx, j.ID, at, o)
			results[j.ID] <- finished{applied, err}
		}()
		require.Eventually(t, func() bool {
			s.batch.mu.Lock()
			defer s.batch.mu.Unlock()
			return len(s.batch.pending) > 0 && s.batch.pending[len(s.batch.pending)-1].key == j.ID
		}, 30*time.Second, time.Millisecond)
	}
	s.batch.mu.Lock()
	finishB, finishA := s.batch.pending[0], s.batch.pending[1]
	s.batch.pending = nil
	s.batch.inFlight = 0
	s.batch.mu.Unlock()
	// In the pipeline: a create, b's finish, a's (which waits for the lock), a create.
	before, beforeJob := createOp(t, `{}`)
	after, afterJob := createOp(t, `{}`)
	before.key, finishB.key, finishA.key, after.key = "0", "1", "2", "3"
	ops := []*batchOp{before, finishB, finishA, after}

	// When the batch runs once, together
	require.False(t, s.batch.runTogether(ctx, nil, ops), "the batch commits")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, finishA.err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code)
	require.NoError(t, before.err, "the create before the lock wait answered")
	require.NoError(t, finishB.err, "b's finish before the lock wait answered")
	require.ErrorIs(t, after.err, errBatchAborted)
	// Then nothing of it is stored, not even the statements that answered before the failure
	var n int
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[])`,
		[]string{(*beforeJob).ID, before.args[0].(string), after.args[0].(string)}).Scan(&n))
	require.Zero(t, n, "jobs created by the rolled-back batch")
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM job_attempts`).Scan(&n))
	require.Zero(t, n, "attempts recorded by the rolled-back batch")
	got, err := s.Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, StatusRunning, got.Status)

	// When the batcher runs it (together again, then alone)
	for _, op := range ops {
		op.err = nil
	}
	s.batch.run(ops)
	// Then every statement but the locked one's is stored, once
	require.NoError(t, before.err)
	require.NoError(t, after.err)
	require.ErrorAs(t, finishA.err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code)
	for id, want := range map[string]finished{a.ID: {false, finishA.err}, b.ID: {true, nil}} {
		select {
		case r := <-results[id]:
			require.Equal(t, want.applied, r.applied, "applied")
			if want.err == nil {
				require.NoError(t, r.err)
			} else {
				require.ErrorAs(t, r.err, &pgErr)
			}
		case <-ctx.Done():
			t.Fatal("a finish was not answered")
		}
	}
	for _, job := range []**Job{beforeJob, afterJob} {
		require.NotNil(t, *job)
		require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = $1`, (*job).ID).Scan(&n))
		require.Equal(t, 1, n, "the created job's events")
	}
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&n))
	require.Equal(t, 4, n, "jobs: a, b and the two creates")
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM job_attempts WHERE job_id = $1`, b.ID).Scan(&n))
	require.Equal(t, 1, n, "b's attempts")
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM job_attempts WHERE job_id = $1`, a.ID).Scan(&n))
	require.Zero(t, n, "a's attempts")
	require.NoError(t, direct.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = $1 AND type = 'succeeded'`, b.ID).Scan(&n))
	require.Equal(t, 1, n, "b's succeeded events")
	got, err = s.Get(ctx, b.ID)
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, got.Status)
}

// The batch's lock_timeout is its own transaction's: a statement of the batch (or one run alone)
// sees batchLockTimeout, or the session's own when that is shorter, and the next statement on
// the same connection the session's, in each of pgx's ways of sending a batch.
func TestBatcher_LockTimeoutIsTheBatchTransactionsOnly(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.URL(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for session, inBatch := range map[string]string{"": "2s", "500ms": "500ms", "10s": "2s"} {
			t.Run(fmt.Sprintf("%v/%q", mode, session), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				cfg, err := pgxpool.ParseConfig(dbURL)
				require.NoError(t, err)
				cfg.MaxConns = 1 // one session: what the batch set is what the next statement sees
				cfg.ConnConfig.DefaultQueryExecMode = mode
				if session != "" {
					cfg.ConnConfig.RuntimeParams["lock_timeout"] = session
				}
				pool, err := pgxpool.NewWithConfig(ctx, cfg)
				require.NoError(t, err)
				defer pool.Close()
				var own string
				require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&own))
				b := &batcher{pool: pool}
				for _, size := range []int{1, 3} {
					ops := make([]*batchOp, size)
					seen := make([]string, size)
					for i := range ops {
						ops[i] = &batchOp{ctx: ctx, key: fmt.Sprint(i), sql: `SELECT current_setting('lock_timeout')`,
							done: make(chan struct{}), scan: scanFunc(func(r pgx.Row) error { return r.Scan(&seen[i]) })}
					}
					b.run(ops)
					for i, op := range ops {
						require.NoError(t, op.err)
						require.Equal(t, inBatch, seen[i], "in a batch of %d", size)
					}
					var after string
					require.NoError(t, pool.QueryRow(ctx, `SELECT current_setting('lock_timeout')`).Scan(&after))
					require.Equal(t, own, after, "the session's, after a batch of %d", size)
				}
			})
		}
	}
}
