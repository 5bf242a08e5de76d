package jobs_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
	"github.com/llmq/llmq/internal/pgtest"
)

// TestStore_CancelOfEndedOrMissingIsOneStatement: a cancel with no transition to make (of a
// job missing, another tenant's, or ended otherwise: succeeded, failed, canceled before) is
// answered from one statement, as a point read is. It was a transaction: BEGIN, the locking read,
// ROLLBACK, three round trips. A cancel that makes its transition is one statement too (it was
// five: BEGIN, the locking read, the update, the event, COMMIT).
func TestStore_CancelOfEndedOrMissingIsOneStatement(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	counted := countedStore(t, b.URL)
	succeeded := b.Create(t, jobstest.Opts{})
	b.Attempt(t, succeeded.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)})
	failed := b.Create(t, jobstest.Opts{})
	b.Attempt(t, failed.ID, jobs.Outcome{Status: jobs.StatusFailed})
	canceled := b.Create(t, jobstest.Opts{})
	_, err := b.Store.Cancel(ctx, canceled.ID)
	require.NoError(t, err)
	other := b.Create(t, jobstest.Opts{Tenant: "other"})
	queued := b.Create(t, jobstest.Opts{})

	for _, tc := range []struct {
		name, id string
		check    func(error) bool
	}{
		{"Missing", "0190a5b2-7c1e-7d3f-9a8b-123456789abc", func(err error) bool { return err == jobs.ErrNotFound }},
		{"AnotherTenants", other.ID, func(err error) bool { return err == jobs.ErrNotFound }},
		{"Succeeded", succeeded.ID, func(err error) bool { return err != nil && err.Error() == "job is succeeded" }},
		{"Failed", failed.ID, func(err error) bool { return err != nil && err.Error() == "job is failed" }},
		{"Canceled", canceled.ID, jobs.AlreadyCanceled},
	} {
		before := counted.n()
		_, err := counted.store.CancelOf(ctx, "default", tc.id)
		require.True(t, tc.check(err), "%s: %v", tc.name, err)
		require.Equal(t, 1, counted.n()-before, "%s: statements of one cancel: %q", tc.name, counted.since(before))
	}
	before := counted.n()
	job, err := counted.store.CancelOf(ctx, "default", queued.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, job.Status)
	require.Equal(t, 1, counted.n()-before, "statements of a cancel that ends its job: %q", counted.since(before))
}

// TestStore_CancelOfAnEndedJobLocksNothing: a cancel of a job that ended otherwise (or was
// canceled before) does not lock its row, so it is answered at once while another session holds
// that row (a retention pass deleting it, an operator's transaction). Its locking read waited
// for that session's end (or the lock timeout).
func TestStore_CancelOfAnEndedJobLocksNothing(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	succeeded := b.Create(t, jobstest.Opts{})
	b.Attempt(t, succeeded.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)})
	canceled := b.Create(t, jobstest.Opts{})
	_, err := b.Store.Cancel(t.Context(), canceled.ID)
	require.NoError(t, err)

	// Both rows locked, as a retention pass's DELETE holds them until it commits.
	tx, err := b.Pool.Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(t.Context())) }()
	_, err = tx.Exec(t.Context(), `SELECT 1 FROM jobs WHERE id = ANY($1) FOR UPDATE`, []string{succeeded.ID, canceled.ID})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = b.Store.Cancel(ctx, succeeded.ID)
	require.EqualError(t, err, "job is succeeded")
	_, err = b.Store.Cancel(ctx, canceled.ID)
	require.True(t, jobs.AlreadyCanceled(err), "%v", err)
	require.NoError(t, tx.Rollback(t.Context()))
}

// counted is a store whose pool's connections count the statements they send (BEGIN, COMMIT and
// ROLLBACK among them: each a round trip), and apart the batches they send (each a round trip,
// whatever its statements).
type counted struct {
	store   *jobs.Store
	mu      sync.Mutex
	sqls    []string
	batches int
}

func (c *counted) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.mu.Lock()
	c.batches++
	c.mu.Unlock()
	return ctx
}

func (c *counted) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *counted) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// roundTrips is how many statements sent alone and batches were sent.
func (c *counted) roundTrips() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sqls) + c.batches
}

func (c *counted) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == "-- ping" { // the pool's check of a connection idle a while
		return ctx
	}
	c.mu.Lock()
	c.sqls = append(c.sqls, d.SQL)
	c.mu.Unlock()
	return ctx
}

func (c *counted) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *counted) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sqls)
}

func (c *counted) since(i int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.sqls[i:]...)
}

// countedStore opens a counted store on the database at url, its pool closed when the test ends.
func countedStore(t *testing.T, url string) *counted {
	t.Helper()
	c := &counted{}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	c.store = jobs.NewStore(pool, nil)
	return c
}

// TestStore_CancelRacingAnotherTransition: a cancel that waits for the lock of a job's row while
// another session moves it ends in exactly one state: behind a finish it answers the finish's
// end (409's TerminalError) and appends nothing; behind a retry of a dead job it cancels the job
// the retry queued (from queued). Its one statement read the row live before the wait, and its
// lock found it changed.
func TestStore_CancelRacingAnotherTransition(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	watch, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer func() { require.NoError(t, watch.Close(context.WithoutCancel(ctx))) }()

	// race cancels id while the row is held by a transaction that runs sql on it, committed once
	// the cancel waits for its lock.
	race := func(t *testing.T, id, sql string) (*jobs.Job, error) {
		tx, err := b.Pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		_, err = tx.Exec(ctx, sql, id)
		require.NoError(t, err)
		type answer struct {
			job *jobs.Job
			err error
		}
		answers := make(chan answer, 1)
		go func() {
			job, err := b.Store.Cancel(ctx, id)
			answers <- answer{job, err}
		}()
		require.Empty(t, pgtest.LockWaitingOrAnswered(ctx, t, watch, answers, 1, "the cancel"), "the cancel did not wait for the lock")
		require.NoError(t, tx.Commit(ctx))
		a := <-answers
		return a.job, a.err
	}

	t.Run("BehindAFinish", func(t *testing.T) {
		job := b.Create(t, jobstest.Opts{})
		_, err := b.Store.BeginAttempt(ctx, job.ID)
		require.NoError(t, err)
		_, err = race(t, job.ID, `WITH u AS (UPDATE jobs SET status = 'succeeded', result = '{}', finished_at = now(),
	event_seq = event_seq + 1 WHERE id = $1 RETURNING id, event_seq)
INSERT INTO job_events (job_id, seq, type) SELECT id, event_seq, 'succeeded' FROM u`)
		require.EqualError(t, err, "job is succeeded")
		require.Equal(t, []jobs.Status{"queued", "running", "succeeded"}, b.Events(t, job.ID))
	})

	t.Run("BehindARetryOfTheDeadJob", func(t *testing.T) {
		dead := b.Dead(t, jobstest.Opts{}, jobs.ReasonRetriesExhausted, 1)
		got, err := race(t, dead.ID, `WITH u AS (UPDATE jobs SET status = 'queued', dead_reason = NULL, finished_at = NULL,
	event_seq = event_seq + 1 WHERE id = $1 RETURNING id, event_seq)
INSERT INTO job_events (job_id, seq, type) SELECT id, event_seq, 'queued' FROM u`)
		require.NoError(t, err)
		require.Equal(t, jobs.StatusCanceled, got.Status)
		require.Equal(t, []jobs.Status{"queued", "running", "dead", "queued", "canceled"}, b.Events(t, dead.ID))
		evs, err := b.Store.Events(ctx, dead.ID, 4)
		require.NoError(t, err)
		require.JSONEq(t, `{"from":"queued"}`, string(evs[0].Payload))
	})
}

// TestStore_CancelAnswersNoRequest: the job a cancel answers (canceled now, or in the
// TerminalError of one ended before) has no Request, as BeginAttempt's has none: no caller of
// Cancel sends it anywhere (an API's answer, an abort, an audit line). The canceled job carried
// its request's whole body back from Postgres, up to the largest a submit takes, for each cancel.
func TestStore_CancelAnswersNoRequest(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	body := json.RawMessage(`{"model":"m","prompt":"` + strings.Repeat("x", 64<<10) + `"}`)
	job := b.Create(t, jobstest.Opts{Request: body})

	got, err := b.Store.Cancel(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusCanceled, got.Status)
	require.Zero(t, len(got.Request), "the canceled job's request came back")

	_, err = b.Store.Cancel(ctx, job.ID)
	var te *jobs.TerminalError
	require.ErrorAs(t, err, &te)
	require.Zero(t, len(te.Job.Request))
	stored, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.JSONEq(t, string(body), string(stored.Request), "the request is kept")
}
