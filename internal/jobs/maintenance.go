package jobs

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Overdue is a job FailOverdue failed.
type Overdue struct {
	ID         string
	Credential string
	// From is the status it waited in: queued, retrying, or running with no live lease.
	From Status
	// CreatedAt and FinishedAt are the job's submit and its end, on Postgres's clock.
	CreatedAt  time.Time
	FinishedAt time.Time
	// HeldSlot reports that its row still holds a limiter slot (Job.SlotSeq), which a worker
	// gives back (see jobs.Store.TakeEndedSlot).
	HeldSlot bool
}

// FailOverdue moves up to limit jobs whose deadline is at or before now and that wait for an
// attempt (queued, retrying, or running with no live lease: see waitingForAttempt) to failed,
// with last_error class ReasonDeadlineExceeded and a "failed" event each (a trigger notifies),
// oldest deadline first, and returns them. A job whose attempt holds a live lease is left to its
// delivery: its call's timeout ends at the deadline and the delivery records the outcome. A
// batch-lane job still waiting for a batch shows batch_state not_sent (it kept waiting); one in
// a committed batch gets it when the batch's send begins.
//
// One statement, in a transaction of its own (see inOrderOfIndex): the jobs are locked FOR
// UPDATE SKIP LOCKED (a job a delivery is changing right now is taken on the next call, not
// waited for) and each is moved only while it is unfinished, like every other transition, so a
// delivery that races it stores no second outcome (its Finish finds the job terminal; its
// BeginAttempt answers ErrNotRunnable). It reads jobs_unfinished_deadline_idx: a call that finds
// nothing costs one index probe, whatever the backlog.
func (s *Store) FailOverdue(ctx context.Context, now time.Time, limit int) ([]Overdue, error) {
	var out []Overdue
	err := s.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, failOverdueSQL, now, limit, ReasonDeadlineExceeded)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Overdue, error) {
			var o Overdue
			err := r.Scan(&o.ID, &o.Credential, &o.From, &o.CreatedAt, &o.FinishedAt, &o.HeldSlot)
			return o, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fail overdue jobs: %w", err)
	}
	return out, nil
}

// DeleteEndedBatches deletes up to limit rows of the batch lane's provider batches that ended
// (or were canceled) before `before` and that no job is in any more (its jobs were deleted, or
// left it), and returns how many. An ended batch gains no job, so nothing waits on the rows.
//
// The statement runs as pgx's unnamed statement (QueryExecModeCacheDescribe), planned for its
// cutoff each time: a prepared statement's generic plan, kept once a backlog's first calls had
// cost more, cannot know how few batches ended before the cutoff, and read the row of every batch
// through the primary key (the day's batches, kept, one buffer each) on every call.
func (s *Store) DeleteEndedBatches(ctx context.Context, before time.Time, limit int) (int64, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM provider_batches WHERE id IN (
	SELECT pb.id FROM provider_batches pb
	WHERE pb.state IN ('ended', 'canceled') AND pb.ended_at < $1
		AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.batch_ref = pb.id)
	LIMIT $2 FOR UPDATE SKIP LOCKED)`, pgx.QueryExecModeCacheDescribe, before, limit)
	if err != nil {
		return 0, fmt.Errorf("delete ended provider batches: %w", err)
	}
	return tag.RowsAffected(), nil
}

// DeleteFinished deletes up to limit jobs of final status that finished before `before`, oldest
// first, with their attempts, events, event watch and idempotency key, and returns how many. A
// later submit with a deleted job's key makes a new job.
//
// One statement in a short transaction of its own (see inOrderOfIndex): the jobs are found through
// jobs_finished_idx and locked FOR UPDATE SKIP LOCKED (a job an operator is retrying is left for a
// later call, and nobody waits on the deleter); attempts and events, which have no foreign key
// (migration 011), go in the same statement, found by primary key (= ANY of an array: joined with
// the deleted jobs, a planner without statistics read both tables whole, every batch); the watch
// and the key follow by their foreign keys' cascade. Callers delete a large backlog in several
// calls, so that no lock is held long.
func (s *Store) DeleteFinished(ctx context.Context, status Status, before time.Time, limit int) (int64, error) {
	if !status.Terminal() {
		return 0, fmt.Errorf("delete finished jobs: %q is not a final status", status)
	}
	var n int64
	err := s.inOrderOfIndex(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, deleteFinishedSQL, status, before, limit).Scan(&n)
	})
	if err != nil {
		return 0, fmt.Errorf("delete finished jobs: %w", err)
	}
	return n, nil
}

// OldestFinished returns when the job of final status that finished first, of those still
// stored, finished, and false when there is none: what the retention pass has yet to delete of
// status begins there. One probe of jobs_finished_idx, whatever the table's size.
func (s *Store) OldestFinished(ctx context.Context, status Status) (time.Time, bool, error) {
	var at *time.Time
	err := s.pool.QueryRow(ctx, oldestFinishedSQL, status).Scan(&at)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read oldest finished job: %w", err)
	}
	if at == nil {
		return time.Time{}, false, nil
	}
	return *at, true, nil
}

// oldestFinishedSQL is OldestFinished's statement ($1 status): the planner answers a min() over
// an index's column after its equality with the first entry of the index (a Limit over an index
// scan), statistics or none.
const oldestFinishedSQL = `SELECT min(finished_at) FROM jobs WHERE status = $1 AND finished_at IS NOT NULL`

// failOverdueSQL is FailOverdue's statement ($1 now, $2 limit, $3 ReasonDeadlineExceeded).
const failOverdueSQL = `
WITH due AS (
	SELECT id, status AS was FROM jobs
	WHERE status IN ('queued', 'running', 'retrying') AND deadline <= $1 AND ` + waitingForAttempt + `
	ORDER BY deadline LIMIT $2
	FOR UPDATE SKIP LOCKED
), u AS (
	UPDATE jobs j SET status = 'failed',
		last_error = jsonb_build_object('class', $3::text,
			'message', 'job deadline passed while it waited (' || due.was || ')'),
		next_attempt_at = NULL, lease_token = NULL, lease_until = NULL,
		finished_at = now(), updated_at = now(), event_seq = j.event_seq + 1,
		batch_state = CASE WHEN j.batch_state = 'waiting' THEN 'not_sent' ELSE j.batch_state END
	FROM due WHERE j.id = due.id AND j.status IN ('queued', 'running', 'retrying')
	RETURNING j.id, j.event_seq, j.credential, j.created_at, j.finished_at, due.was, j.slot_seq IS NOT NULL AS held
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload)
	SELECT id, event_seq, 'failed', jsonb_build_object('from', was, 'reason', $3::text) FROM u
)
SELECT id::text, credential, was, created_at, finished_at, held FROM u`

// deleteFinishedSQL is DeleteFinished's statement ($1 status, $2 before, $3 limit). The
// condition finished_at IS NOT NULL is jobs_finished_idx's: without it the index does not apply.
const deleteFinishedSQL = `
WITH victims AS (
	SELECT id FROM jobs WHERE status = $1 AND finished_at IS NOT NULL AND finished_at < $2
	ORDER BY finished_at LIMIT $3
	FOR UPDATE SKIP LOCKED` + deleteVictimsSQL + `
SELECT count(*) FROM d, notified`

// deleteVictimsSQL ends a statement whose first CTE, victims, selects (and locks) the ids of
// jobs to delete: it deletes them (CTE d, their ids) with their attempts and events, which have
// no foreign key (migration 011) and are found by primary key (= ANY of an array: joined with
// the deleted jobs, a planner without statistics read both tables whole, every batch); their
// event watch and idempotency key follow by their foreign keys' cascade. Every delete of jobs
// (retention, dead purges, a tenant's deletion) ends with it, so none leaves a part behind.
//
// CTE notified announces each deleted job that is watched on ChangesChannel (payload the job's
// ID, as keepLateUsage's: the Listener signals its subscribers 0, "read the job again", which
// finds it gone), in the deleting transaction: a page of the job open meanwhile (the console's)
// learns of the delete at once, not at its next keep-alive. The watches are read in the
// statement's snapshot, before the cascade deletes them (at the statement's end). It is one
// row, a count, which the statement's final SELECT must join (FROM d, notified): a SELECT in a
// WITH runs only as far as the statement reads it.
const deleteVictimsSQL = `
), d AS (
	DELETE FROM jobs j USING victims v WHERE j.id = v.id RETURNING j.id
), a AS (
	DELETE FROM job_attempts WHERE job_id = ANY (ARRAY(SELECT id FROM d))
), e AS (
	DELETE FROM job_events WHERE job_id = ANY (ARRAY(SELECT id FROM d))
), notified AS (
	SELECT count(pg_notify('` + ChangesChannel + `', w.job_id::text)) FROM job_watches w
	WHERE w.job_id = ANY (ARRAY(SELECT id FROM d)) AND w.expires_at > now()
)`
