package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/jobstest"
)

// settledNow is a settle channel that has fired: CancelTenant walks once.
func settledNow() <-chan time.Time {
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return ch
}

// tenantJobs makes n jobs of tenant: queued, every third running, every fifth dead (after a
// retrying attempt), every seventh succeeded; it returns their IDs by status.
func tenantJobs(t *testing.T, b *jobstest.Bundle, tenant string, n int) map[jobs.Status][]string {
	t.Helper()
	ctx := t.Context()
	out := map[jobs.Status][]string{}
	for i := range n {
		job := b.Create(t, jobstest.Opts{Tenant: tenant})
		st := jobs.StatusQueued
		switch {
		case i%7 == 0:
			b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)})
			st = jobs.StatusSucceeded
		case i%5 == 0:
			b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusRetrying})
			b.Attempt(t, job.ID, jobs.Outcome{Status: jobs.StatusDead, DeadReason: jobs.ReasonRetriesExhausted})
			st = jobs.StatusDead
		case i%3 == 0:
			_, err := b.Store.BeginAttempt(ctx, job.ID)
			require.NoError(t, err)
			st = jobs.StatusRunning
		}
		out[st] = append(out[st], job.ID)
	}
	return out
}

// canceledEvents returns the payloads of the 'canceled' events of the tenant's jobs, sorted.
func canceledEvents(t *testing.T, b *jobstest.Bundle, tenant string) []string {
	t.Helper()
	rows, err := b.Pool.Query(t.Context(), `SELECT e.payload::text FROM job_events e JOIN jobs j ON j.id = e.job_id
WHERE j.tenant = $1 AND e.type = 'canceled' ORDER BY 1`, tenant)
	require.NoError(t, err)
	var out []string
	for rows.Next() {
		var p string
		require.NoError(t, rows.Scan(&p))
		out = append(out, p)
	}
	require.NoError(t, rows.Err())
	return out
}

// TestStore_CancelTenantIsAStatementAPage: offboarding a tenant of N jobs cancels them a page
// (500; here 10, so that few jobs make many pages) a statement (sent in one batch with its
// transaction's BEGIN and SET, then COMMIT: two round trips a page; they were 4), not one
// statement each: 100,000 live jobs were 100,000 round trips and more. What it does is the
// per-job way's (Cancel of each): the same jobs canceled, counted and aborted once each, the
// same events ({"from": ...}, a dead job's previous_reason kept), the ended jobs and another
// tenant's left alone. It was a statement a job, and the pages' reads: 1,029 round trips for
// 1,017 unfinished jobs.
func TestStore_CancelTenantIsAStatementAPage(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	const n, page = 150, 10
	acme := tenantJobs(t, b, "acme", n)
	twin := tenantJobs(t, b, "twin", n) // canceled the per-job way, as reference
	other := b.Create(t, jobstest.Opts{Tenant: "other"})
	counted := countedStore(t, b.URL)
	jobs.SetCancelPage(counted.store, page)

	var mu sync.Mutex
	aborted := map[string]int{}
	abort := func(j *jobs.Job) error {
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, jobs.StatusCanceled, j.Status)
		aborted[j.ID]++
		return nil
	}
	before := counted.roundTrips()
	live, err := counted.store.CancelTenant(ctx, "acme", settledNow(), abort)
	require.NoError(t, err)
	liveStatements := counted.roundTrips() - before
	before = counted.n()
	dead, err := counted.store.CancelDeadOfTenant(ctx, "acme", abort)
	require.NoError(t, err)
	deadStatements := counted.n() - before

	unfinished := len(acme[jobs.StatusQueued]) + len(acme[jobs.StatusRunning])
	require.Equal(t, unfinished, live)
	require.Equal(t, len(acme[jobs.StatusDead]), dead)
	// Several pages of each (the last short, or empty): two round trips a live page, one a dead
	// one.
	require.Greater(t, unfinished, 4*page)
	require.Greater(t, dead, 2*page)
	require.LessOrEqual(t, liveStatements, 2*(unfinished/page+1), "round trips of CancelTenant: %d jobs", unfinished)
	require.LessOrEqual(t, deadStatements, dead/page+1, "round trips of CancelDeadOfTenant: %d jobs", dead)
	require.Len(t, aborted, live+dead)
	for id, k := range aborted {
		require.Equal(t, 1, k, "job %s aborted %d times", id, k)
	}

	// The per-job way, on the twin.
	twinN := 0
	for _, st := range []jobs.Status{jobs.StatusQueued, jobs.StatusRunning, jobs.StatusDead} {
		for _, id := range twin[st] {
			_, err := b.Store.Cancel(ctx, id)
			require.NoError(t, err)
			twinN++
		}
	}
	require.Equal(t, twinN, live+dead)
	require.Equal(t, canceledEvents(t, b, "twin"), canceledEvents(t, b, "acme"), "the same events")
	count := func(tenant string) map[string]int {
		rows, err := b.Pool.Query(ctx, `SELECT status, count(*) FROM jobs WHERE tenant = $1 GROUP BY status`, tenant)
		require.NoError(t, err)
		out := map[string]int{}
		for rows.Next() {
			var st string
			var k int
			require.NoError(t, rows.Scan(&st, &k))
			out[st] = k
		}
		require.NoError(t, rows.Err())
		return out
	}
	require.Equal(t, count("twin"), count("acme"), "acme's and twin's jobs end alike")
	got, err := b.Store.Get(ctx, other.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status, "another tenant's job is untouched")
}

// TestStore_CancelTenantWaitsForALockedJob: a job whose row another transaction holds (a
// worker's transition, a retry, a catch-up) is passed over by its page's statement (SKIP
// LOCKED: the page waits for nobody, its other jobs canceled meanwhile) and canceled by itself
// once the lock is let go, counted and aborted once: it is not left live.
// TestStore_CancelTenantPageThatFailsLeavesNoTransaction: a page's batch (BEGIN, SET LOCAL, the
// statement, COMMIT) whose statement fails (here a trigger raises) cancels nothing, and leaves
// the pool's connection in no transaction: the next user of it (a pool of one connection) finds
// enable_sort as it was and its statements run, not "current transaction is aborted"; a rerun
// cancels the job.
func TestStore_CancelTenantPageThatFailsLeavesNoTransaction(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx := t.Context()
	job := b.Create(t, jobstest.Opts{Tenant: "acme"})
	cfg, err := pgxpool.ParseConfig(b.URL)
	require.NoError(t, err)
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	store := jobs.NewStore(pool, nil)
	_, err = b.Pool.Exec(ctx, `CREATE FUNCTION fail_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'no cancel today' USING ERRCODE = '53100';
END $$;
CREATE TRIGGER fail_cancel BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION fail_cancel();`)
	require.NoError(t, err)

	n, err := store.CancelTenant(ctx, "acme", settledNow(), nil)
	require.ErrorContains(t, err, "no cancel today")
	require.Zero(t, n)
	var sort string
	require.NoError(t, pool.QueryRow(ctx, `SHOW enable_sort`).Scan(&sort))
	require.Equal(t, "on", sort, "the failed page's SET LOCAL ended with its transaction")
	var tx1, tx2 int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT txid_current()`).Scan(&tx1))
	require.NoError(t, pool.QueryRow(ctx, `SELECT txid_current()`).Scan(&tx2))
	require.NotEqual(t, tx1, tx2, "each statement its own transaction")
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status, "nothing canceled")

	_, err = b.Pool.Exec(ctx, `DROP TRIGGER fail_cancel ON jobs`)
	require.NoError(t, err)
	n, err = store.CancelTenant(ctx, "acme", settledNow(), nil)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// TestStore_CancelTenantInterruptedInAPageCancelsNothingOfIt: a run interrupted (ctx ended:
// ctl's Ctrl-C, the console's ActionTimeout) while a page's statement runs cancels none of that
// page's jobs: its transaction commits only once the run has read what it canceled (to count and
// abort them). Sent in one batch with the statement, the COMMIT ran as soon as the statement
// ended, the run gone: the page's jobs were canceled, neither counted nor aborted.
func TestStore_CancelTenantInterruptedInAPageCancelsNothingOfIt(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	job := b.Create(t, jobstest.Opts{Tenant: "acme"})
	// The page's statement waits (its update's trigger) for an advisory lock the test holds.
	_, err := b.Pool.Exec(ctx, `CREATE FUNCTION hold_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock_shared(4242);
	RETURN NEW;
END $$;
CREATE TRIGGER hold_cancel BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION hold_cancel();`)
	require.NoError(t, err)
	holder, err := b.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(4242)`)
	require.NoError(t, err)

	run, interrupt := context.WithCancel(ctx)
	defer interrupt()
	done := make(chan error, 1)
	go func() {
		_, err := b.Store.CancelTenant(run, "acme", settledNow(), nil)
		done <- err
	}()
	require.NoError(t, jobs.WaitForLockWaiterOf(ctx, b.Pool, "cand AS"))
	interrupt()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.Canceled)
	case <-ctx.Done():
		t.Fatal("CancelTenant did not return")
	}
	// The statement goes on without its run, to its end.
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
	require.NoError(t, err)
	for {
		var n int
		require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND strpos(query, 'cand AS') > 0`).Scan(&n))
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the interrupted page's session did not end")
		case <-time.After(5 * time.Millisecond):
		}
	}
	got, err := b.Store.Get(ctx, job.ID)
	require.NoError(t, err)
	require.Equal(t, jobs.StatusQueued, got.Status, "the interrupted page rolled back")
}

func TestStore_CancelTenantWaitsForALockedJob(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var ids []string
	for range 5 {
		ids = append(ids, b.Create(t, jobstest.Opts{Tenant: "acme"}).ID)
	}
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, ids[2])
	require.NoError(t, err)

	var mu sync.Mutex
	var aborted []string
	type answer struct {
		n   int
		err error
	}
	done := make(chan answer, 1)
	go func() {
		n, err := b.Store.CancelTenant(ctx, "acme", settledNow(), func(j *jobs.Job) error {
			mu.Lock()
			defer mu.Unlock()
			aborted = append(aborted, j.ID)
			return nil
		})
		done <- answer{n, err}
	}()
	waitForLockWaiter(ctx, t, b.Pool, "live AS", "the cancel of the locked job")
	// The page did not wait for the held row (SKIP LOCKED): its other jobs were canceled and
	// committed before it let go. A page that waits holds its locks meanwhile, in the order of
	// its walk: a cycle with RetryDead's or the catch-up's order.
	var committed int
	require.NoError(t, b.Pool.QueryRow(ctx, `SELECT count(*) FROM jobs WHERE tenant = 'acme' AND status = 'canceled'`).Scan(&committed))
	require.Equal(t, len(ids)-1, committed, "the page's other jobs canceled while one was held")
	require.NoError(t, tx.Commit(ctx))
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		t.Fatal("CancelTenant did not return")
	}
	require.NoError(t, a.err)
	require.Equal(t, 5, a.n)
	mu.Lock()
	require.ElementsMatch(t, ids, aborted)
	mu.Unlock()
	for _, id := range ids {
		require.Equal(t, []jobs.Status{jobs.StatusQueued, jobs.StatusCanceled}, b.Events(t, id))
	}
}

// TestStore_CancelTenantRacingWorkers: workers begin and finish the tenant's jobs while it is
// offboarded: every job ends once, either canceled (one 'canceled' event, counted and aborted
// once, the worker's finish not applied) or as the worker finished it (no 'canceled' event,
// neither counted nor aborted); none is left live.
func TestStore_CancelTenantRacingWorkers(t *testing.T) {
	t.Parallel()
	b := jobstest.New(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	const n = 120
	var ids []string
	for range n {
		ids = append(ids, b.Create(t, jobstest.Opts{Tenant: "acme"}).ID)
	}
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		mu      sync.Mutex
		aborted = map[string]int{}
		werr    = make(chan error, n)
	)
	for _, id := range ids {
		wg.Go(func() {
			<-start
			job, err := b.Store.BeginAttempt(ctx, id)
			if err != nil {
				if !errors.Is(err, jobs.ErrNotRunnable) {
					werr <- err
				}
				return
			}
			if _, err := b.Store.Finish(ctx, id, &jobs.Attempt{Number: job.Attempts, Credential: job.Credential,
				StartedAt: time.Now(), Latency: time.Millisecond, StatusCode: 200, Class: "retryable"},
				jobs.Outcome{Status: jobs.StatusSucceeded, Result: json.RawMessage(`{}`)}); err != nil {
				werr <- err
			}
		})
	}
	var canceled int
	var cerr error
	wg.Go(func() {
		<-start
		canceled, cerr = b.Store.CancelTenant(ctx, "acme", settledNow(), func(j *jobs.Job) error {
			mu.Lock()
			defer mu.Unlock()
			aborted[j.ID]++
			return nil
		})
	})
	close(start)
	wg.Wait()
	close(werr)
	require.NoError(t, cerr)
	for err := range werr {
		require.NoError(t, err)
	}
	ended := 0
	for _, id := range ids {
		job, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		evs := b.Events(t, id)
		switch job.Status {
		case jobs.StatusCanceled:
			ended++
			require.Equal(t, jobs.StatusCanceled, evs[len(evs)-1])
			require.Equal(t, 1, aborted[id], "job %s aborted once", id)
		case jobs.StatusSucceeded:
			require.NotContains(t, evs, jobs.StatusCanceled)
			require.Zero(t, aborted[id])
		default:
			t.Fatalf("job %s left %s", id, job.Status)
		}
		require.LessOrEqual(t, countOf(evs, jobs.StatusCanceled), 1)
	}
	require.Equal(t, ended, canceled, "counted once each")
	require.Len(t, aborted, canceled)
}

func countOf(evs []jobs.Status, st jobs.Status) int {
	k := 0
	for _, e := range evs {
		if e == st {
			k++
		}
	}
	return k
}
