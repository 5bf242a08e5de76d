package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// DeleteEndedOfTenant deletes up to limit of the tenant's jobs that have ended (succeeded,
// failed, dead, canceled), with their attempts, events, event watch and idempotency key (the
// retention pass's cascade, see DeleteFinished), and returns how many: for an operator deleting
// a revoked tenant's data. Callers delete a large backlog in several calls, so that no lock is
// held long, until a call deletes fewer than limit.
//
// It leaves alone: the jobs that have not ended (cancel them first: a job deleted under its
// delivery would be found gone by it, but a waiting one would be sent); a job locked by a
// concurrent change (FOR UPDATE SKIP LOCKED: the deleter waits for nobody); and a job in a
// provider batch still open (committed or submitted), which the batch lane reads to decide
// what the batch sends or whether to cancel it at the provider: gone, a batch whose send may
// have reached the provider would be marked canceled without being looked up (and paid for).
// The batch lane cancels a sent batch none of whose jobs waits any more, after which its jobs
// can be deleted. RemainingOfTenant counts what is left.
func (s *Store) DeleteEndedOfTenant(ctx context.Context, tenant string, limit int) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, deleteEndedOfTenantSQL, tenant, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("delete the tenant's jobs: %w", err)
	}
	return n, nil
}

// RemainingOfTenant counts the tenant's jobs still stored: unfinished ones (queued, running,
// retrying) and the ended ones DeleteEndedOfTenant leaves for now (in an open provider batch,
// or locked by a change under way).
func (s *Store) RemainingOfTenant(ctx context.Context, tenant string) (unfinished, ended int, err error) {
	err = s.pool.QueryRow(ctx, `
SELECT count(*) FILTER (WHERE status IN ('queued', 'running', 'retrying')),
       count(*) FILTER (WHERE status NOT IN ('queued', 'running', 'retrying'))
FROM jobs WHERE tenant = $1`, tenant).Scan(&unfinished, &ended)
	if err != nil {
		return 0, 0, fmt.Errorf("count the tenant's jobs: %w", err)
	}
	return unfinished, ended, nil
}

// deleteEndedOfTenantSQL is DeleteEndedOfTenant's statement ($1 tenant, $2 limit): the jobs
// are found through jobs_tenant_created_idx (tenant first).
const deleteEndedOfTenantSQL = `
WITH victims AS (
	SELECT j.id FROM jobs j
	WHERE j.tenant = $1 AND j.status IN ('succeeded', 'failed', 'dead', 'canceled')
		AND NOT EXISTS (SELECT 1 FROM provider_batches pb
			WHERE pb.id = j.batch_ref AND pb.state IN ('committed', 'submitted'))
	LIMIT $2
	FOR UPDATE OF j SKIP LOCKED` + deleteVictimsSQL + `
SELECT count(*) FROM d, notified`

// CancelTenant cancels every job of the tenant that has not ended (as Cancel does one), walking
// them page by page (cancelPages: one statement cancels a page), and calls abort (when not nil)
// with each job it canceled, to stop its task (a call in flight); once settled has fired it
// walks them once more from the start (at once, if it fired before the first walk began): API
// replicas may accept the tenant's submits until its revocation reaches them (their
// Authenticator's TTL). It returns how many it canceled; a
// job that ended meanwhile is left as it ended. An abort that fails does not stop it (its job
// is canceled: an attempt in flight runs to its end, unstored); the first such failure is
// returned at the end, with their count (*AbortError).
//
// A page whose COMMIT's answer was lost (the call fails) canceled its jobs and neither counted
// nor aborted them: the operator's rerun finds them canceled, and AbortInFlightOfTenant, which
// package offboard runs first, aborts the tasks of those whose attempt may still be in flight.
//
// A dead job retried (RetryDead) is queued with a fresh deadline, which a walk's cursor may have
// passed; the walk from the start once settled has fired takes it. RetryDead leaves a revoked
// tenant's jobs alone, so one is retried after the revocation only by a retry statement that read
// the tenant before it was revoked and committed later; it escapes both walks only if it commits
// after the last walk began, past settle (the Authenticator's TTL and a second), waiting on row
// locks all that while. That is left to the operator: it stays live (RemainingOfTenant counts
// it; a tenant deletion keeps the tenant), and a rerun cancels it.
func (s *Store) CancelTenant(ctx context.Context, tenant string, settled <-chan time.Time, abort func(*Job) error) (int, error) {
	var t cancelTally
	fired := false
	for {
		if !fired {
			select {
			case <-settled:
				fired = true
			default:
			}
		}
		final := fired
		if err := s.cancelPages(ctx, cancelUnfinishedPageSQL, true, tenant, abort, &t); err != nil {
			return t.n, err
		}
		switch {
		case final && t.abortErr != nil:
			return t.n, &AbortError{Unaborted: t.unaborted, Err: t.abortErr}
		case final:
			return t.n, nil
		}
		select {
		case <-ctx.Done():
			return t.n, ctx.Err()
		case <-settled:
			fired = true
		}
	}
}

// CancelDeadOfTenant cancels every dead job of the tenant, as Cancel does one (its dead reason
// kept in the canceled event), and calls abort (when not nil) with each, as CancelTenant does:
// for an operator ending a revoked tenant's work. A dead letter waits for an operator, whose
// retry of every dead letter (`ctl dead retry --all`, after an outage) would send it again and
// pay for an answer the revoked tenant can no longer read. It walks the tenant's dead letters
// once, oldest death first (jobs_finished_idx), a page a statement (cancelPages), and returns
// how many it canceled; a job retried meanwhile (queued again) is canceled as well, one purged
// or otherwise ended meanwhile is left alone. An abort that fails does not stop it; the first
// such failure is returned at the end, with their count (*AbortError).
func (s *Store) CancelDeadOfTenant(ctx context.Context, tenant string, abort func(*Job) error) (int, error) {
	var t cancelTally
	if err := s.cancelPages(ctx, cancelDeadPageSQL, false, tenant, abort, &t); err != nil {
		return t.n, err
	}
	if t.abortErr != nil {
		return t.n, &AbortError{Unaborted: t.unaborted, Err: t.abortErr, Dead: true}
	}
	return t.n, nil
}

// AbortError is the error of CancelTenant and CancelDeadOfTenant when every cancel was made but
// abort failed for some of the jobs canceled (an attempt in flight runs to its end, unstored): a
// later CancelTenant aborts nothing more, but AbortInFlightOfTenant aborts again those whose
// attempt may still be in flight. It unwraps to the first failure.
type AbortError struct {
	// Unaborted counts the canceled jobs abort failed for.
	Unaborted int
	// Err is the first failure, naming its job.
	Err error
	// Dead reports whether the jobs were dead letters (CancelDeadOfTenant's).
	Dead bool
}

// Error says how many jobs' tasks were not aborted, and the first failure.
func (e *AbortError) Error() string {
	if e.Dead {
		return fmt.Sprintf("%d canceled dead jobs' tasks could not be aborted; first, %v", e.Unaborted, e.Err)
	}
	return fmt.Sprintf("%d canceled jobs' tasks could not be aborted (an attempt in flight runs to its end, unstored); first, %v", e.Unaborted, e.Err)
}

// Unwrap returns the first failure.
func (e *AbortError) Unwrap() error { return e.Err }

// cancelTally counts what cancelEach did across its calls.
type cancelTally struct {
	// n is how many jobs were canceled, unaborted how many of them abort failed for (the
	// first failure abortErr).
	n, unaborted int
	abortErr     error
}

// AbortInFlightOfTenant calls abort with each of the tenant's canceled jobs whose attempt may
// still be in flight: its lease (lease_until, which a cancel keeps) has not run out, so its
// delivery has not yet renewed it and found the job ended. It is for a rerun of CancelTenant,
// before it: a page of CancelTenant whose COMMIT's answer was lost canceled its jobs without
// aborting them, and the rerun finds them canceled (see docs/decisions.md, "A tenant's cancel
// aborts again the canceled jobs still in flight"). It may abort again a task already aborted
// (a job a client canceled, say), which is harmless. Once a lease has run out its attempt has
// stopped; a queued job's task left behind runs, finds the job canceled and does nothing. An
// abort that fails does not stop it: the first failure is returned at the end, with their count
// (*AbortError). It reads only the jobs canceled lately (abortInFlightOfTenantSQL), not every
// job the tenant has.
func (s *Store) AbortInFlightOfTenant(ctx context.Context, tenant string, abort func(*Job) error) error {
	var t cancelTally
	rows, err := s.pool.Query(ctx, abortInFlightOfTenantSQL, tenant)
	if err != nil {
		return fmt.Errorf("read the tenant's canceled jobs in flight: %w", err)
	}
	inFlight, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Job, error) { return s.scanJob(r) })
	if err != nil {
		return fmt.Errorf("read the tenant's canceled jobs in flight: %w", err)
	}
	for _, job := range inFlight {
		t.abort(job, abort)
	}
	if t.abortErr != nil {
		return &AbortError{Unaborted: t.unaborted, Err: t.abortErr}
	}
	return nil
}

// abortInFlightOfTenantSQL selects AbortInFlightOfTenant's jobs ($1 tenant) through
// jobs_finished_idx: a canceled job's lease is renewed no more (RenewLease and BeginAttempt take
// unfinished jobs only), so one still live was canceled (finished_at, its transaction's start)
// less than AttemptLease ago, give or take how long that cancel waited for the row's lock; the
// hour bounds both with room. Through jobs_tenant_created_idx it read every job of the tenant:
// 1.7 to 2.5 s a run for a tenant of a million jobs, 0.1 ms this way.
var abortInFlightOfTenantSQL = `SELECT ` + jobColumnsNoRequest + ` FROM jobs
WHERE status = 'canceled' AND finished_at > now() - interval '1 hour' AND tenant = $1
	AND lease_until > clock_timestamp()`

// cancelEach cancels each job of ids as Cancel does, skipping one that ended (or was deleted)
// meanwhile, and calls abort (when not nil) with each it canceled; an abort that fails is
// counted in t, not returned. It stops at the first other error.
func (s *Store) cancelEach(ctx context.Context, ids []string, abort func(*Job) error, t *cancelTally) error {
	for _, id := range ids {
		job, err := s.Cancel(ctx, id)
		var te *TerminalError
		switch {
		case errors.Is(err, ErrNotFound) || errors.As(err, &te):
			continue // ended (purged, retried and ended, deleted by retention) meanwhile
		case err != nil:
			return err
		}
		t.canceled(job, abort)
	}
	return nil
}

// canceled counts job, canceled, and calls abort (when not nil) with it, counting a failure.
func (t *cancelTally) canceled(job *Job, abort func(*Job) error) {
	t.n++
	t.abort(job, abort)
}

// abort calls abort (when not nil) with job, counting a failure.
func (t *cancelTally) abort(job *Job, abort func(*Job) error) {
	if abort == nil {
		return
	}
	if err := abort(job); err != nil {
		if t.unaborted++; t.abortErr == nil {
			t.abortErr = fmt.Errorf("job %s: %w", job.ID, err)
		}
	}
}

// cancelPageSize is how many jobs one statement of cancelPages reads and cancels: 500
// statements for a tenant of 250,000 jobs, and a page's row locks are held for one statement
// only.
const cancelPageSize = 500

// cancelPages cancels, page by page in the order of a walk key (at, id), the tenant's jobs that
// sql selects (cancelUnfinishedPageSQL or cancelDeadPageSQL: $1 tenant, $2 and $3 the key after
// which the page starts, $4 the page's size), calling abort (when not nil) with each it
// canceled, as cancelEach does; inOrder runs each statement as inOrderOfIndex would, in two
// round trips (queryInOrderOfIndex). The statement
// locks its page's rows FOR UPDATE SKIP LOCKED, waiting for nobody (so it holds no lock while it
// waits, and its lock order cannot close a cycle with RetryDead's or the Listener's catch-up),
// cancels those and appends their events as cancelSQL does. A row of the page it did not cancel
// (locked by a worker's transition, a retry, a catch-up; or changed since its snapshot) comes
// back unlocked, and is canceled by itself afterwards (cancelEach: Cancel waits for its lock,
// and leaves it alone when it ended meanwhile), holding no other lock: none is skipped that
// was live, none canceled twice. It stops at the first error, the pages before kept.
func (s *Store) cancelPages(ctx context.Context, sql string, inOrder bool, tenant string, abort func(*Job) error, t *cancelTally) error {
	at, after := time.Time{}, uuid.Nil.String()
	for {
		var canceled []*Job
		var others []string
		args := []any{tenant, at, after, s.cancelPage}
		read := func(rows pgx.Rows) error {
			defer rows.Close()
			for rows.Next() {
				var ours bool
				var key time.Time
				job, err := s.scanJob(rows, &ours, &key)
				if err != nil {
					return err
				}
				if key.After(at) || key.Equal(at) && job.ID > after {
					at, after = key, job.ID
				}
				if ours {
					canceled = append(canceled, job)
				} else {
					others = append(others, job.ID)
				}
			}
			return rows.Err()
		}
		var err error
		if inOrder {
			err = s.queryInOrderOfIndex(ctx, sql, args, read)
		} else {
			var rows pgx.Rows
			if rows, err = s.pool.Query(ctx, sql, args...); err == nil {
				err = read(rows)
			}
		}
		if err != nil {
			return fmt.Errorf("cancel the tenant's jobs: %w", err)
		}
		for _, job := range canceled {
			t.canceled(job, abort)
		}
		if err := s.cancelEach(ctx, others, abort, t); err != nil {
			return err
		}
		if len(canceled)+len(others) < s.cancelPage {
			return nil
		}
	}
}

// queryInOrderOfIndex runs sql (with args) in a transaction whose statements may not sort, as
// inOrderOfIndex does, in two round trips where inOrderOfIndex's are four: BEGIN, SET LOCAL and
// the statement go out as one batch (pgx.Batch.BeginTx), then COMMIT once read has read (and
// closed) the statement's rows. The COMMIT is not sent with the statement: Postgres would run it
// as soon as the statement ended, whatever became of the caller, so that an interrupted run (ctx
// ended while the statement ran) committed a page it never read, neither counted nor aborted.
// When anything fails before the COMMIT is sent the transaction is rolled back (a connection
// left in it is closed, not put back in the pool). An error of the COMMIT itself may come after
// it committed (its answer lost, see CancelTenant).
func (s *Store) queryInOrderOfIndex(ctx context.Context, sql string, args []any, read func(pgx.Rows) error) error {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.Queue(noSortSettings)
	b.Queue(sql, args...)
	br := s.pool.SendBatch(ctx, &b)
	tx := br.Tx()
	defer func() { _ = tx.Rollback(ctx) }() // after Commit a no-op; on ctx ended it closes the connection
	err := func() error {
		for range 2 { // begin, set
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		rows, err := br.Query()
		if err != nil {
			return err
		}
		return read(rows)
	}()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// cancelPageSQL is the statement of a page of cancelPages, from the CTE cand selecting the page
// (k_id, k_at: its walk key, the column key of the row cand read) to its answer: the jobs
// canceled (jobColumnsNoRequest, true, k_at), then the page's other jobs as the statement's
// snapshot read them (false: not locked, or no longer matching once locked; their key is the
// column as cand read it, in the same snapshot). live locks by primary key (= ANY of an array,
// as RetryDead's update: joined, a planner without statistics read the table whole) and skips a
// row locked. A canceled job's k_at is joined from cand (the cancel changes finished_at, the dead
// walk's key): a subquery on cand for each row scanned cand each time, 500 times 250 rows a page
// (a page of 500 took 140 ms, joined 119, on our test machine). The page's other jobs leave out
// the canceled ones with NOT IN, which Postgres answers from a hash of c built once (ids are never
// NULL, so it means NOT EXISTS): anti-joined with NOT EXISTS, a planner expecting one canceled job
// rescanned c for each row of the page (125,000 rows for a page of 500, 27 ms of its 72).
func cancelPageSQL(cand, match, key string) string {
	return `
WITH cand AS (` + cand + `
), live AS (
	SELECT id AS live_id, status AS from_status, dead_reason AS from_reason FROM jobs
	WHERE id = ANY (ARRAY(SELECT k_id FROM cand)) AND ` + match + `
	FOR UPDATE SKIP LOCKED` + cancelLockedSQL + `
SELECT ` + jobColumnsNoRequest + `, true, cand.k_at FROM c JOIN cand ON cand.k_id = c.id
UNION ALL
SELECT ` + jobColumnsNoRequest + `, false, jobs.` + key + ` FROM jobs
WHERE id = ANY (ARRAY(SELECT k_id FROM cand)) AND jobs.id NOT IN (SELECT id FROM c)`
}

// cancelUnfinishedPageSQL is CancelTenant's page: the tenant's unfinished jobs in the order of
// (deadline, id) (cancelUnfinishedCandSQL).
var cancelUnfinishedPageSQL = cancelPageSQL(cancelUnfinishedCandSQL, `status IN ('queued', 'running', 'retrying')`, "deadline")

// cancelUnfinishedCandSQL selects a page of CancelTenant: it must read
// jobs_unfinished_deadline_idx in order from the key ($2, $3) and stop after $4 of the
// tenant's rows (run in inOrderOfIndex). Newest first through jobs_tenant_created_idx, each
// page read again the rows the pages before had canceled, and the last one every job the
// tenant ever had: a walk of a backlog of N jobs read N²/1000 rows, and minutes on a tenant of
// a million jobs. deadline is NOT NULL: no job is left out of the walk's order.
const cancelUnfinishedCandSQL = `
	SELECT id AS k_id, deadline AS k_at FROM jobs
	WHERE status IN ('queued', 'running', 'retrying') AND tenant = $1
		AND deadline >= $2 AND (deadline, id) > ($2, $3::uuid)
	ORDER BY deadline, jobs.id LIMIT $4`

// cancelDeadPageSQL is CancelDeadOfTenant's page: the tenant's dead jobs in the order of
// (finished_at, id), oldest death first (jobs_finished_idx).
var cancelDeadPageSQL = cancelPageSQL(`
	SELECT id AS k_id, finished_at AS k_at FROM jobs
	WHERE status = 'dead' AND finished_at IS NOT NULL AND tenant = $1 AND (finished_at, id) > ($2, $3::uuid)
	ORDER BY finished_at, jobs.id LIMIT $4`, `status = 'dead'`, "finished_at")
