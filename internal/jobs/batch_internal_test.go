package jobs

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/pgtest"
)

// createOp is Create's batched statement for a new job, with where its answer goes.
func createOp(t *testing.T, meta string) (*batchOp, **Job) {
	t.Helper()
	id := uuid.NewString()
	sql, args := insertJob(id, nil, CreateParams{Tenant: "default", Credential: "c",
		Fingerprint: "f", Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour,
		Metadata: json.RawMessage(meta)}, nil)
	var job *Job
	return &batchOp{ctx: context.Background(), key: id, sql: sql, args: args, done: make(chan struct{}), scan: scanFunc(func(r pgx.Row) (err error) {
		job, err = new(Store).scanJob(r)
		return err
	})}, &job
}

func TestBatcher_OneBadStatementFailsAlone(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	b := &batcher{pool: pool}
	good1, job1 := createOp(t, `{}`)
	bad, _ := createOp(t, `{"x":"\u0000"}`) // jsonb refuses \u0000: a data exception
	good2, job2 := createOp(t, `{}`)
	b.run([]*batchOp{good1, bad, good2})

	require.NoError(t, good1.err)
	require.NoError(t, good2.err)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, bad.err, &pgErr)
	require.Equal(t, "22P05", pgErr.Code)
	// The failed batch was rolled back and its good statements ran again alone: each job once.
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT count(*) FROM jobs WHERE id = ANY($1::uuid[])`, []string{(*job1).ID, (*job2).ID}).Scan(&n))
	require.Equal(t, 2, n)
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM job_events`).Scan(&n))
	require.Equal(t, 2, n)
	for _, op := range []*batchOp{good1, bad, good2} {
		select {
		case <-op.done:
		default:
			t.Fatal("a caller was not released")
		}
	}
}

// TestBatcher_GaveUpBeforeSentIsNotSent: a caller whose context ended while its statement
// waited for a batch gets its context's error, and the statement never runs.
func TestBatcher_GaveUpBeforeSentIsNotSent(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	b := &batcher{pool: pool}
	kept, keptJob := createOp(t, `{}`)
	gone, _ := createOp(t, `{}`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	gone.ctx = ctx
	b.run([]*batchOp{gone, kept})
	require.ErrorIs(t, gone.err, context.Canceled)
	require.NoError(t, kept.err)
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM jobs`).Scan(&n))
	require.Equal(t, 1, n)
	require.NotNil(t, *keptJob)
}

// TestBatcher_SameJobTwiceInOneBatch: statements of one transaction see each other, so two
// deliveries' transitions of one job in one batch behave as if sent one after the other.
func TestBatcher_SameJobTwiceInOneBatch(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := NewStore(pool, nil)
	ctx := context.Background()
	job, _, err := s.Create(ctx, CreateParams{Tenant: "default", Credential: "c", Fingerprint: "f",
		Request: json.RawMessage(`{}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)

	var wg sync.WaitGroup
	applied := make([]bool, 2)
	errs := make([]error, 2)
	// Hold the batcher's slots so that both finishes queue, then go out as one batch. Create
	// returned when its batch was done, but its sender gives its slot back a moment later: wait
	// for that before taking them all.
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		if s.batch.inFlight != 0 {
			return false
		}
		s.batch.inFlight = batchInFlight
		return true
	}, 30*time.Second, time.Millisecond)
	for i := range 2 {
		wg.Go(func() {
			applied[i], errs[i] = s.Finish(ctx, job.ID, nil, Outcome{Status: StatusSucceeded, Result: json.RawMessage(`{"n":1}`)})
		})
	}
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return len(s.batch.pending) == 2
	}, 30*time.Second, time.Millisecond)
	s.batch.mu.Lock()
	ops := s.batch.pending
	s.batch.pending = nil
	s.batch.inFlight = 0
	s.batch.mu.Unlock()
	require.True(t, s.batch.runTogether(ctx, nil, ops), "the batch commits")
	for _, op := range ops {
		close(op.done)
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ElementsMatch(t, []bool{true, false}, applied, "exactly one finish applies")
	got, err := s.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, StatusSucceeded, got.Status)
	require.Equal(t, 2, got.EventSeq)
}

// TestBatcher_ConcurrentCallers: many callers at once each get their own answer.
func TestBatcher_ConcurrentCallers(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s := NewStore(pool, nil)
	ctx := context.Background()
	const n = 200
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			job, _, err := s.Create(ctx, CreateParams{Tenant: "default", Credential: "c", Fingerprint: "f",
				Request: json.RawMessage(`{}`), MaxAttempts: 3, Timeout: time.Hour})
			if err != nil {
				t.Error(err)
				return
			}
			got, err := s.Get(ctx, job.ID)
			if err != nil || got.ID != job.ID {
				t.Errorf("get %s: %v %v", job.ID, got, err)
				return
			}
			ids[i] = job.ID
		})
	}
	wg.Wait()
	var count int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(DISTINCT id) FROM jobs WHERE id = ANY($1::uuid[])`, ids).Scan(&count))
	require.Equal(t, n, count)
}

// A create whose batch committed but whose answer was lost (the connection dropped after the
// commit) is run again alone by the batcher and meets its own row: it answers with that job, so
// the submit succeeds once instead of failing for a job that exists.
func TestCreate_RerunAfterALostCommitAnswersItsOwnJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	s := NewStore(pool, nil)
	id := uuid.Must(uuid.NewV7())
	s.newID = func() (uuid.UUID, error) { return id, nil }
	p := CreateParams{Tenant: "default", Credential: "c", Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour,
		Metadata: json.RawMessage(`{}`)}
	// Given the first try's batch committed the job (and its event)
	sql, args := insertJob(id.String(), nil, p, nil)
	_, err := pool.Exec(ctx, sql, args...)
	require.NoError(t, err)

	// When the batcher runs the same create again
	job, replayed, err := s.Create(ctx, p)

	// Then it answers with the job, once, with one event
	require.NoError(t, err)
	require.False(t, replayed)
	require.Equal(t, id.String(), job.ID)
	require.Equal(t, StatusQueued, job.Status)
	require.JSONEq(t, `{"model":"m"}`, string(job.Request))
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&n))
	require.Equal(t, 1, n)
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM job_events WHERE job_id = $1`, id).Scan(&n))
	require.Equal(t, 1, n)

	// And a row with that ID that this create could not have written is not taken for its own
	other := p
	other.Tenant = "someone-else"
	_, _, err = s.Create(ctx, other)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
}

// TestQueryJob_CallerThatGaveUpReadsNothing: a caller whose context ends while its statement is
// out returns the context's error and reads nothing the batch scans afterwards. Under -race, such
// a read is reported (the CI failure this test was written for). Between the caller's return and
// the batch's scan, the test only waits on channels: a mutex or a poll taken then can order the
// caller's read before the scan in the race detector's eyes, and hide the race. Both ways out: a
// statement sent alone from its caller's goroutine, and one sent in a batch.
func TestQueryJob_CallerThatGaveUpReadsNothing(t *testing.T) {
	t.Parallel()
	for _, batched := range []bool{false, true} {
		t.Run(map[bool]string{false: "alone", true: "batched"}[batched], func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			job, _, err := NewStore(pool, nil).Create(context.Background(), CreateParams{Tenant: "default",
				Credential: "c", Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
			require.NoError(t, err)
			s := NewStore(pool, nil) // its batcher sends one statement: the held one
			idle := make(chan struct{})
			s.batch.idle = func() { close(idle) }
			if batched {
				// The slot taken, the statement queues; a sender then takes it over.
				s.batch.mu.Lock()
				s.batch.inFlight = batchInFlight
				s.batch.mu.Unlock()
			}

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type answer struct {
				job *Job
				err error
			}
			answered := make(chan answer, 1)
			go func() {
				// The statement answers the job's row after a second.
				j, err := s.queryJob(ctx, job.ID, `SELECT `+jobColumnsNoRequest+
					` FROM jobs, (SELECT pg_sleep(1) AS llmq_held) w WHERE id = $1`, job.ID)
				answered <- answer{j, err}
			}()
			if batched {
				require.Eventually(t, func() bool {
					s.batch.mu.Lock()
					defer s.batch.mu.Unlock()
					return len(s.batch.pending) == 1
				}, 30*time.Second, time.Millisecond, "the statement never queued")
				go s.batch.send()
			}
			require.Eventually(t, func() bool {
				var held bool
				err := pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT FROM pg_stat_activity
WHERE state = 'active' AND query LIKE '%llmq_held%' AND datname = current_database() AND pid <> pg_backend_pid())`).Scan(&held)
				return err == nil && held
			}, 30*time.Second, 5*time.Millisecond, "the statement was never seen running")
			cancel()
			select {
			case a := <-answered:
				require.ErrorIs(t, a.err, context.Canceled)
				require.Nil(t, a.job)
			case <-time.After(30 * time.Second):
				t.Fatal("the caller was not released when its context ended")
			}
			select {
			case <-idle: // the batch has scanned the answer: a read of its target is reported by now
			case <-time.After(30 * time.Second):
				t.Fatal("the batch never finished")
			}
		})
	}
}

// TestBatcher_QueuedBehindACallersOwnStatementIsSent: a statement that finds the batcher idle runs
// on its caller's goroutine; one that arrives meanwhile waits, and is sent when the first is done,
// with no third statement to start a batch.
func TestBatcher_QueuedBehindACallersOwnStatementIsSent(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := pgtest.Pool(t)
	s := NewStore(pool, nil)
	job, _, err := s.Create(ctx, CreateParams{Tenant: "default", Credential: "c",
		Request: json.RawMessage(`{"model":"m"}`), MaxAttempts: 3, Timeout: time.Hour})
	require.NoError(t, err)

	held := make(chan error, 1)
	go func() {
		_, err := s.queryJob(ctx, job.ID, `SELECT `+jobColumnsNoRequest+
			` FROM jobs, (SELECT pg_sleep(0.3) AS llmq_own) w WHERE id = $1`, job.ID)
		held <- err
	}()
	require.Eventually(t, func() bool {
		s.batch.mu.Lock()
		defer s.batch.mu.Unlock()
		return s.batch.inFlight == 1 && len(s.batch.pending) == 0
	}, 30*time.Second, time.Millisecond, "the first statement never went out")

	queued := make(chan error, 1)
	go func() {
		_, err := s.Get(ctx, job.ID)
		queued <- err
	}()
	select {
	case err := <-held:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the held statement never answered")
	}
	select {
	case err := <-queued:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the statement queued behind it was never sent")
	}
}
