package jobs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ListParams select jobs for List.
type ListParams struct {
	// Status keeps only jobs in this status; empty: any.
	Status Status
	// Tenant keeps only this tenant's jobs; empty: every tenant's. A name no job has (no such
	// tenant) selects none.
	Tenant string
	// Limit caps the rows returned. Default 50.
	Limit int
}

// List returns jobs, newest first (created_at, then id), without their requests (Job.Request is
// nil), read in the order of Page's index (jobs_created_idx, or jobs_tenant_created_idx with a
// tenant) until Limit of them match.
func (s *Store) List(ctx context.Context, p ListParams) ([]*Job, error) {
	if p.Limit <= 0 {
		p.Limit = 50
	}
	sql, args, err := pageSQL(PageParams{Status: p.Status, Tenant: p.Tenant}, nil, jobColumnsNoRequest, 0, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	var out []*Job
	err = s.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Job, error) { return s.scanJob(r) })
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return out, nil
}

// DeadFilter selects dead jobs. Zero fields do not filter.
type DeadFilter struct {
	// IDs keeps only these jobs (malformed IDs match nothing).
	IDs []string
	// Reason keeps jobs with this dead_reason (e.g. ReasonRetriesExhausted).
	Reason string
	// Credential keeps jobs that were sent to this credential: their own (which
	// llmq_dead_letters_total names), or a fallback they failed over to before they died (the
	// last, the one they died on, is the one their webhook alert and paused credential name).
	// A fallback a job never reached does not select it.
	Credential string
	// Tenant keeps this tenant's jobs.
	Tenant string
	// Since keeps jobs that died at or after it.
	Since time.Time
	// Before keeps jobs that died before it.
	Before time.Time
	// Limit caps the rows of a page of PageDead (not of RetryDead). Default 50.
	Limit int
}

// where returns the SQL condition selecting f's dead jobs in table alias t, appending its
// arguments to args. A dead job always has finished_at (every final transition sets it); the
// condition finished_at IS NOT NULL says so to the planner, which without it can use neither
// jobs_finished_idx nor jobs_dead_reason_idx (both partial) and reads the whole table.
func (f DeadFilter) where(t string, args *[]any) string {
	arg := func(v any) string {
		*args = append(*args, v)
		return "$" + strconv.Itoa(len(*args))
	}
	conds := []string{t + ".status = 'dead'", t + ".finished_at IS NOT NULL"}
	if f.IDs != nil {
		ids := make([]string, 0, len(f.IDs))
		for _, id := range f.IDs {
			if ValidID(id) {
				ids = append(ids, id)
			}
		}
		conds = append(conds, t+".id = ANY("+arg(ids)+"::uuid[])")
	}
	if f.Reason != "" {
		conds = append(conds, t+".dead_reason = "+arg(f.Reason))
	}
	if f.Credential != "" {
		conds = append(conds, sentTo(t+".", arg(f.Credential)))
	}
	if f.Tenant != "" {
		conds = append(conds, t+".tenant = "+arg(f.Tenant))
	}
	if !f.Since.IsZero() {
		conds = append(conds, t+".finished_at >= "+arg(f.Since))
	}
	if !f.Before.IsZero() {
		conds = append(conds, t+".finished_at < "+arg(f.Before))
	}
	return strings.Join(conds, " AND ")
}

// sentTo is the SQL condition selecting the jobs (columns prefixed by prefix: "" or an alias and
// a dot) that were sent to the credential in parameter c: their own, or a fallback they failed
// over to (fallbacks[1:credential_index]: those before the current one, and the current one,
// which a job that ended ended on: the one that answered, or that it died on). A fallback a job
// has not reached does not select it. The job list's credential filter and the dead letters'
// are this one, so a job is found under the same credentials in both.
func sentTo(prefix, c string) string {
	return "(" + prefix + "credential = " + c + " OR " +
		c + " = ANY (" + prefix + "fallbacks[1:" + prefix + "credential_index]))"
}

// DeadCursor is the PageDead cursor that goes on after dead job j (as the Next of a page ending
// with it), for a caller that names the last job it showed rather than keeping a cursor (ctl dead
// list --after ID). A job that is not dead has none: ok is false.
func DeadCursor(j *Job) (cursor string, ok bool) {
	if j.Status != StatusDead || j.FinishedAt == nil {
		return "", false
	}
	return encodeCursor(*j.FinishedAt, j.ID), true
}

// PageDead returns one page of the dead jobs f selects, most recently dead first (finished_at,
// then id), at most f.Limit (default 50) of them, from after: the Next of the previous page (""
// for the first), without their requests (Job.Request is nil). Its Next is "" on the last page. The cursor is the (finished_at, id) of the
// page's last job: a job retried or purged meanwhile simply leaves its page, and one that died
// after the first page was read appears on no page.
// Errors: ErrBadCursor, or a wrapped database error.
func (s *Store) PageDead(ctx context.Context, f DeadFilter, after string) (*JobPage, error) {
	if f.Limit <= 0 {
		f.Limit = 50
	}
	f.Limit = min(f.Limit, math.MaxInt-1) // the statement reads one row more
	sql, args, err := pageDeadQuery(f, after)
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("page dead jobs: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*Job, error) { return s.scanJob(r) })
	if err != nil {
		return nil, fmt.Errorf("page dead jobs: %w", err)
	}
	page := &JobPage{Jobs: list}
	if len(list) > f.Limit {
		page.Jobs = list[:f.Limit]
		last := page.Jobs[f.Limit-1]
		page.Next = encodeCursor(*last.FinishedAt, last.ID)
	}
	return page, nil
}

// pageDeadQuery is PageDead's statement: f.Limit+1 rows (the one more says a next page follows),
// in the order of the cursor's condition: jobs.id, a uuid (id alone names the output column
// id::text, which sorted as text, by the database's collation; see pageSQL).
func pageDeadQuery(f DeadFilter, after string) (string, []any, error) {
	var args []any
	where := f.where("jobs", &args)
	if after != "" {
		at, id, err := decodeCursor(after)
		if err != nil {
			return "", nil, err
		}
		args = append(args, at, id)
		where += " AND (jobs.finished_at, jobs.id) < ($" + strconv.Itoa(len(args)-1) + ", $" + strconv.Itoa(len(args)) + "::uuid)"
	}
	args = append(args, f.Limit+1)
	return `SELECT ` + jobColumnsNoRequest + ` FROM jobs WHERE ` + where + `
ORDER BY jobs.finished_at DESC, jobs.id DESC LIMIT $` + strconv.Itoa(len(args)), args, nil
}

// RetryDeadOpts are RetryDead's per-call knobs; nil takes the defaults.
type RetryDeadOpts struct {
	// Batch is how many jobs one transaction retries. Default 500.
	Batch int
	// BatchFunc, when set, is called with each batch's jobs once the batch has committed, before
	// the next begins (on RetryDead's goroutine): the caller enqueues them and tells its progress.
	// An error it returns stops RetryDead, which returns it.
	BatchFunc func(ctx context.Context, retried []Unfinished) error
}

// RetryDead puts every dead job f selects back to queued and returns them (f.Limit does not apply),
// each with its priority, which names its task's queue. Each gets a fresh attempt budget (attempts
// 0) and its whole credential chain back (its next attempt goes to its own credential, failing over
// to its fallbacks as a new job's does), a fresh deadline (its timeout from Postgres's clock, as a
// new job's), no dead reason, no usage (the job's usage is its answer's, and the new round has none
// yet: a late answer's usage kept for the dead job stays on its attempt's row), and a "queued"
// event whose payload names the previous reason. Its earlier attempts stay in job_attempts and the
// new ones continue their numbering (jobs.attempt_base, migration 002). Jobs that are not dead are
// left alone and not returned. The caller then enqueues the returned jobs (Tasks.Requeue); one it
// fails to enqueue is picked up by the sweeper. A dead job of a revoked tenant is left alone too,
// named or not (see docs/decisions.md, "A retry of dead letters skips revoked tenants"):
// CountDeadOfRevoked counts those f selects.
//
// It works in batches of opts.Batch jobs, oldest death first, each in a transaction of its own,
// so that a retry of 100,000 dead letters never holds their row locks at once (the sweeper, the
// retention pass and the workers would wait on it) and a failure keeps the batches done. Each
// batch goes on after the last job the batch before locked (a cursor on (finished_at, id)), so
// the dead letters it leaves alone (a revoked tenant's) are read once, not once a batch. It
// retries only the jobs that died before it began (by Postgres's clock): a job it retried that
// dies again meanwhile is not retried twice, and the run ends. A matching job another
// transaction holds is waited for, not skipped, and taken if it is still dead. A death that
// commits after the run began carries the time its transaction began as finished_at, which may
// be before the run began: if that is after the cursor when a later batch reads, the run retries
// it; if the cursor has passed it, the run does not (it stays dead, for the next retry, and is
// neither returned nor counted anywhere). A batch Postgres aborts as a deadlock's victim took no
// effect and is run again, a few times (retryDeadBatch). On an error it returns the jobs of the
// batches that committed with it.
func (s *Store) RetryDead(ctx context.Context, f DeadFilter, opts *RetryDeadOpts) ([]Unfinished, error) {
	var o RetryDeadOpts
	if opts != nil {
		o = *opts
	}
	if o.Batch <= 0 {
		o.Batch = retryDeadBatch
	}
	var began time.Time
	if err := s.pool.QueryRow(ctx, `SELECT now()`).Scan(&began); err != nil {
		return nil, fmt.Errorf("retry dead jobs: %w", err)
	}
	var out []Unfinished
	var cur *deadKey // the last job the batches before locked (nil: none yet)
	for {
		sql, args := retryDeadQuery(f, began, cur, o.Batch)
		batch, keys, err := s.retryDeadBatch(ctx, sql, args)
		if err != nil {
			return out, fmt.Errorf("retry dead jobs: %w", err)
		}
		out = append(out, batch...)
		if len(batch) > 0 && o.BatchFunc != nil {
			if err := o.BatchFunc(ctx, batch); err != nil {
				return out, err
			}
		}
		if len(batch) < o.Batch {
			return out, nil
		}
		for _, k := range keys {
			if cur == nil || k.after(*cur) {
				cur = &k
			}
		}
	}
}

// retryDeadBatch runs one batch of RetryDead (retryDeadQuery's sql and args) and returns its
// jobs and their places in RetryDead's order. A batch Postgres aborts as a deadlock's victim is
// run again (retryAborted): its statement is its transaction, so an aborted batch took no effect.
// RetryDead locks in the order of (finished_at, id), as the Listener's catch-up does, but the
// two statements' snapshots may differ (a job that dies between them is found by one only), and
// a cycle can still form in that window; the catch-up, which locks a few rows, usually waits
// past deadlock_timeout last, and RetryDead's backend, which finds the cycle, is the victim.
func (s *Store) retryDeadBatch(ctx context.Context, sql string, args []any) (batch []Unfinished, keys []deadKey, err error) {
	err = retryAborted(ctx, func() error {
		keys = nil
		rows, err := s.pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		batch, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Unfinished, error) {
			u := Unfinished{Status: StatusQueued}
			var k deadKey
			err := r.Scan(&u.ID, &u.Priority, &k.finishedAt)
			k.id = u.ID
			keys = append(keys, k)
			return u, err
		})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return batch, keys, nil
}

// retryAborted runs run, a statement that is its own transaction (so one that failed took no
// effect), and runs it again when Postgres aborted it to resolve a conflict with another
// transaction (aborted), up to abortedTries times in all, abortedBackoff times its try apart:
// the other transaction goes on once run's locks are let go, and ends. It returns run's last
// error, or ctx's (wrapping run's) when ctx ends during a wait.
func retryAborted(ctx context.Context, run func() error) error {
	for try := 1; ; try++ {
		err := run()
		if err == nil || try == abortedTries || !aborted(err) {
			return err
		}
		backoff := time.NewTimer(time.Duration(try) * abortedBackoff)
		select {
		case <-ctx.Done():
			backoff.Stop()
			return fmt.Errorf("%w (after %w)", ctx.Err(), err)
		case <-backoff.C:
		}
	}
}

// abortedTries is how many times in all retryAborted runs a statement Postgres aborts;
// abortedBackoff is the wait before its second try (twice that before its third, and so on).
const (
	abortedTries   = 5
	abortedBackoff = 50 * time.Millisecond
)

// aborted reports whether err is Postgres aborting a transaction to resolve a conflict with
// another, which a new try of it may not meet: deadlock_detected (40P01) or
// serialization_failure (40001).
func aborted(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == pgerrDeadlockDetected || pgErr.Code == pgerrSerializationFailure)
}

// pgerrDeadlockDetected is SQLSTATE deadlock_detected; pgerrSerializationFailure is
// serialization_failure.
const (
	pgerrDeadlockDetected     = "40P01"
	pgerrSerializationFailure = "40001"
)

// deadKey is a dead job's place in RetryDead's order: (finished_at, id).
type deadKey struct {
	finishedAt time.Time
	id         string
}

// after reports whether k comes after o in RetryDead's order. IDs compare as their text: the
// canonical lowercase form orders as the bytes, as Postgres orders uuids.
func (k deadKey) after(o deadKey) bool {
	if c := k.finishedAt.Compare(o.finishedAt); c != 0 {
		return c > 0
	}
	return k.id > o.id
}

// retryDeadBatch is how many jobs one of RetryDead's transactions retries by default.
const retryDeadBatch = 500

// retryDeadQuery is one batch of RetryDead: one statement, so its own transaction. It locks
// (FOR UPDATE, waiting) up to limit of f's dead jobs that died by began and come after the job
// after (nil: from the first), oldest death first, in the order of (finished_at, id), which
// every plan and snapshot agree on, so two retries lock in
// the same order (deaths whose transactions began in the same microsecond share finished_at:
// ordered by it alone, they went in each plan's order, and concurrent retries deadlocked);
// a job that is no longer dead once its lock is free is passed over. The jobs it puts back to
// queued no longer match. It returns each job's id, priority and finished_at, of which RetryDead
// takes the greatest (finished_at, id) as the next batch's after: started again at the first,
// each batch read every dead job it skips (a revoked tenant's) before reaching its own, and a
// retry of 100,000 with 100,000 skipped read 100,000 rows 200 times. (The finished_at a row is
// locked with is the one it was found with: only a retry puts a dead job back, so no dead job's
// finished_at changes while it stays dead.) The update finds them by primary key (= ANY of an
// array): joined with the CTE, the planner read the whole table for a few hundred rows out of
// 20,000.
// Each job's deadline runs from the statement's clock_timestamp(), on Postgres's clock: a
// retrying host's skew (an API host's console, ctl's) would otherwise be every retried job's.
// A limiter slot left in a dead job's row (held by a duplicate delivery after the dying
// attempt's lease had run out) is dropped: kept, the retried job's first delivery sent on it at
// once, unpaced (the row said no next attempt time, and a held slot is not asked for again).
// The job starts over at its own credential (credential_index 0): left on the fallback it died
// on, it never went back to its own credential, and waited on that fallback while it was paused.
func retryDeadQuery(f DeadFilter, began time.Time, after *deadKey, limit int) (string, []any) {
	args := []any{began, limit}
	where := f.where("d", &args)
	if after != nil {
		args = append(args, after.finishedAt, after.id)
		at, id := "$"+strconv.Itoa(len(args)-1), "$"+strconv.Itoa(len(args))
		// The first half is the index's condition (jobs_finished_idx), the second the order's.
		where += " AND d.finished_at >= " + at + " AND (d.finished_at, d.id) > (" + at + ", " + id + "::uuid)"
	}
	return `
WITH old AS (
	SELECT d.id, d.dead_reason, d.finished_at FROM jobs d WHERE ` + where + ` AND d.finished_at <= $1 AND ` + notRevokedSQL + `
	ORDER BY d.finished_at, d.id LIMIT $2
	FOR UPDATE
), u AS (
	UPDATE jobs j SET status = 'queued', attempts = 0,
		attempt_base = greatest(j.attempt_base + j.attempts,
			coalesce((SELECT max(a.attempt) FROM job_attempts a WHERE a.job_id = j.id), 0)),
		dead_reason = NULL, usage = NULL, finished_at = NULL, next_attempt_at = NULL, slot_seq = NULL, slot_grant = NULL,
		credential_index = 0,
		deadline = clock_timestamp() + j.timeout_ms * interval '1 millisecond',
		updated_at = now(), event_seq = j.event_seq + 1
	WHERE j.id = ANY (ARRAY(SELECT id FROM old))
	RETURNING j.id, j.event_seq, j.priority
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload)
	SELECT u.id, u.event_seq, 'queued',
		jsonb_strip_nulls(jsonb_build_object('retried_from', 'dead', 'previous_reason', old.dead_reason))
	FROM u JOIN old ON old.id = u.id
)
SELECT u.id::text, u.priority, old.finished_at FROM u JOIN old ON old.id = u.id`, args
}

// notRevokedSQL is the condition, on dead job d, that its tenant is not revoked (a tenant without
// a row, "default" with auth off, is not). It is a filter on each dead job as it is read (a
// subplan, hashed or a look-up by primary key), which "IS TRUE" keeps the planner from turning
// into an anti-join: as a join, its shape went by the statistics of tenants, which autovacuum
// gathers only once 50 of its rows have changed (a deployment of a few tenants may never have
// them), and without them the planner took tenants for hundreds of rows, hashed them and joined
// every matching dead job before RetryDead's sort and limit, so that each batch read every dead
// job the batches after it would take. As a filter, the planner estimates half the dead jobs pass
// it, whatever the statistics, and walks jobs_finished_idx in order up to the batch's limit.
const notRevokedSQL = `(NOT EXISTS (SELECT 1 FROM tenants t WHERE t.name = d.tenant AND t.revoked_at IS NOT NULL)) IS TRUE`

// CountDeadOfRevoked counts the dead jobs f selects whose tenant is revoked: those RetryDead
// leaves alone (f.Limit does not apply).
func (s *Store) CountDeadOfRevoked(ctx context.Context, f DeadFilter) (int, error) {
	var args []any
	where := f.where("d", &args)
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM jobs d WHERE `+where+` AND NOT (`+notRevokedSQL+`)`, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count dead jobs of revoked tenants: %w", err)
	}
	return n, nil
}

// PurgeDeadOpts are PurgeDead's options; nil or zero fields mean none.
type PurgeDeadOpts struct {
	// BatchFunc, if set, is called after each transaction that deleted a full batch
	// (PurgeDeadBatch jobs: more may follow) with the jobs deleted so far, the batch's
	// included: a long purge can tell its progress.
	BatchFunc func(ctx context.Context, purged int64)
}

// PurgeDead deletes the jobs that died before `before`, with their attempts, events and
// idempotency keys (a later submit with such a key makes a new job), and returns how many. It
// deletes PurgeDeadBatch jobs per transaction (see DeleteFinished), so a large purge holds no
// lock long; a dead job an operator is retrying meanwhile is left alone. On an error it returns
// the jobs the transactions before it deleted.
func (s *Store) PurgeDead(ctx context.Context, before time.Time, opts *PurgeDeadOpts) (int64, error) {
	var total int64
	for {
		n, err := s.DeleteFinished(ctx, StatusDead, before, PurgeDeadBatch)
		total += n
		if err != nil || n < PurgeDeadBatch {
			return total, err
		}
		if opts != nil && opts.BatchFunc != nil {
			opts.BatchFunc(ctx, total)
		}
	}
}

// runMSSQL is a finished job's submit → end in milliseconds, from the start of its current run:
// its deadline less its timeout, which the insert and a retry of a dead letter set (both to
// clock_timestamp() + timeout_ms), so a retried dead letter counts from its retry, not from its
// first submit (see Stats.SubmitToResultP95MS and docs/decisions.md, "Submit → result counts a
// retried dead letter from its retry").
const runMSSQL = `extract(epoch FROM finished_at - (deadline - timeout_ms * interval '1 millisecond')) * 1000`

// PurgeDeadBatch is how many jobs one of PurgeDead's transactions deletes.
const PurgeDeadBatch = 500

// Stats summarise the jobs and provider calls of a window.
type Stats struct {
	// Since is the start of the window.
	Since time.Time `json:"since"`
	// ByStatus counts the jobs waiting or running now (queued, running, retrying), whenever they
	// were submitted, and the jobs that reached each final status in the window, whenever they
	// were submitted: a backlog older than the window is still counted, and a job is counted
	// where it ended, not where it began.
	ByStatus map[Status]int `json:"jobs_by_status"`
	// Submitted counts the jobs created in the window.
	Submitted int `json:"jobs_submitted"`
	// Attempts counts the provider calls started in the window.
	Attempts int `json:"attempts"`
	// Retries counts those calls that were not their job's first.
	Retries int `json:"retries"`
	// Succeeded counts the jobs that succeeded in the window.
	Succeeded int `json:"succeeded"`
	// RetryRate is Retries/Attempts; nil without attempts.
	RetryRate *float64 `json:"retry_rate"`
	// RequestsPerSuccess is Attempts/Succeeded; nil without successes.
	RequestsPerSuccess *float64 `json:"requests_per_success"`
	// SubmitToResultP50 and P95 are percentiles of submit → success of the jobs that succeeded
	// in the window, waits and retries included; nil without successes. A job's span starts
	// where its timeout starts (its deadline less its timeout, on Postgres's clock): at its
	// submit (the insert, a moment after created_at, the start of the submit's transaction), or,
	// for a dead letter an operator retried, at its latest retry. Measured from created_at, a
	// dead letter retried a month after its submit counted as a success of a month (751h).
	SubmitToResultP50MS *float64 `json:"submit_to_result_p50_ms"`
	SubmitToResultP95MS *float64 `json:"submit_to_result_p95_ms"`
}

// statsSQL is Stats's one statement; $1 is the window in microseconds. The window's start is
// agoSQL: the same instant wherever it is written, and folded by the planner to estimate each
// condition on it, as a parameter was. The unfinished counts read jobs_unfinished_deadline_idx
// and the rows it names (a backlog's worth); the final ones but succeeded jobs_finished_idx
// alone (its status and finished_at); submitted jobs_created_idx alone (or the table, when most
// jobs are in the window). The window's successes are read once (ok), for their count and
// percentiles, and Stats puts that count among the counts by status: counted there too, they
// were a second scan of jobs_finished_idx over them, 40% of the statement's buffers and 10-20%
// of its time at 211,000 successes in the window (docs/decisions.md).
const statsSQL = `
SELECT ` + agoSQL + `,
	(SELECT coalesce(jsonb_object_agg(c.status, c.n), '{}') FROM (
		SELECT status::text AS status, count(*) AS n FROM jobs
		WHERE status IN ('queued', 'running', 'retrying') GROUP BY status
		UNION ALL
		SELECT status::text, count(*) FROM jobs
		WHERE status IN ('failed', 'dead', 'canceled')
			AND finished_at IS NOT NULL AND finished_at >= ` + agoSQL + `
		GROUP BY status) c),
	(SELECT count(*) FROM jobs WHERE created_at >= ` + agoSQL + `),
	a.n, a.retries, ok.n, ok.p50, ok.p95
FROM (SELECT count(*) AS n, count(*) FILTER (WHERE attempt > 1) AS retries
	FROM job_attempts WHERE started_at >= ` + agoSQL + `) a,
	(SELECT count(*) AS n,
		percentile_cont(0.5) WITHIN GROUP (ORDER BY ` + runMSSQL + `) AS p50,
		percentile_cont(0.95) WITHIN GROUP (ORDER BY ` + runMSSQL + `) AS p95
	FROM jobs WHERE status = 'succeeded' AND finished_at >= ` + agoSQL + `) ok`

// Stats computes the statistics of the window that ends now on Postgres's clock, the clock that
// wrote the jobs' created_at and finished_at; Stats.Since is its start on that clock. The
// caller's clock takes no part: a host off by X (an API host's console, an operator's laptop
// running ctl) would count the window's ends and submits as of X later or earlier. The
// attempts' started_at are the workers' clocks (jobs.Attempt.StartedAt): a worker off by X
// still shifts its attempts by X. Every figure comes from one statement, so one snapshot: the
// counts by status, the successes, their percentiles and the attempts agree (read apart, a job
// that succeeded between two reads was counted a success with no success among the counts). A
// negative window starts after now: it counts only the jobs waiting or running.
func (s *Store) Stats(ctx context.Context, window time.Duration) (*Stats, error) {
	st := &Stats{ByStatus: map[Status]int{}}
	var byStatus map[string]int
	if err := s.pool.QueryRow(ctx, statsSQL, window.Microseconds()).
		Scan(&st.Since, &byStatus, &st.Submitted, &st.Attempts, &st.Retries,
			&st.Succeeded, &st.SubmitToResultP50MS, &st.SubmitToResultP95MS); err != nil {
		return nil, fmt.Errorf("compute the stats of the last %s: %w", window, err)
	}
	for status, n := range byStatus {
		st.ByStatus[Status(status)] = n
	}
	if st.Succeeded > 0 { // absent when none, as the other statuses' counts
		st.ByStatus[StatusSucceeded] = st.Succeeded
	}
	if st.Attempts > 0 {
		v := float64(st.Retries) / float64(st.Attempts)
		st.RetryRate = &v
	}
	if st.Succeeded > 0 {
		v := float64(st.Attempts) / float64(st.Succeeded)
		st.RequestsPerSuccess = &v
	}
	return st, nil
}
