package jobs

import (
	"context"
	"errors"
	"fmt"
)

// TerminalError is returned when a job cannot change because it already ended; Status is the
// status it ended in.
type TerminalError struct {
	Status Status
	// Job is the job as the cancel read it (its Request nil): the answer to a cancel resent, say
	// (see AlreadyCanceled). Store.Cancel's TerminalError always has it.
	Job *Job
}

func (e *TerminalError) Error() string { return "job is " + string(e.Status) }

// AlreadyCanceled reports whether err is Cancel's answer for a job that a cancel had already
// ended: the caller's cancel is done, by an earlier one (its own, whose answer it lost, say).
func AlreadyCanceled(err error) bool {
	var te *TerminalError
	return errors.As(err, &te) && te.Status == StatusCanceled
}

// Cancel moves a queued, retrying, running or dead job to canceled and appends the event, in one
// statement that locks the job's row only when it has that transition to make. It returns the
// canceled job (without its Request: Get's has it), ErrNotFound (also for a malformed ID),
// ErrBusy (wrapped: the job's status changed under each of its cancelTries runs; nothing was
// done), or a *TerminalError naming the status of a job that had already ended otherwise (see
// AlreadyCanceled: one canceled before changes nothing, appends nothing, and its TerminalError
// holds the job as it is). A job missing or ended is answered from that one statement's read,
// without waiting for whoever holds its row.
//
// A dead job waits for an operator, whose retry (RetryDead) would send it again: canceled, it
// is no dead letter any more and no retry takes it (the client no longer wants it; see
// docs/decisions.md, "A dead job can be canceled"). Its dead reason moves to the event's payload
// (previous_reason), as a retry's does.
//
// Cancel only writes Postgres. Every later write of the worker is conditional on a non-terminal
// status, so an attempt in flight can no longer store a result; to stop that attempt's provider
// call, signal its task too (dispatch.Tasks.AbortEnded). A limiter slot held in the row
// (Job.SlotSeq) stays there, for a worker to give back (TakeEndedSlot).
func (s *Store) Cancel(ctx context.Context, id string) (*Job, error) {
	return s.cancel(ctx, id, nil)
}

// CancelOf is Cancel of tenant's job id: another tenant's job is ErrNotFound, exactly like a
// missing one, and its row is not locked.
func (s *Store) CancelOf(ctx context.Context, tenant, id string) (*Job, error) {
	return s.cancel(ctx, id, &tenant)
}

// cancelSQL cancels job $1 (of tenant $2 alone unless $2 is NULL) when it is live or dead, and
// answers with one row: the job's columns without its request (jobColumnsNoRequest), then
// whether this statement canceled it.
// The lock (live) orders it against the worker's transitions and an operator's retry; a row that
// is ended (or another tenant's) does not match it and is not locked, and the row answered is
// then the job as the statement's snapshot read it. A job that ended while the lock was waited
// for (the worker's outcome committed first) no longer matches it either: its row answered is
// the snapshot's, still live or dead (see cancel).
var cancelSQL = `
WITH live AS (
	SELECT id AS live_id, status AS from_status, dead_reason AS from_reason FROM jobs
	WHERE id = $1 AND ($2::text IS NULL OR tenant = $2) AND status IN ('queued', 'retrying', 'running', 'dead')
	FOR UPDATE` + cancelLockedSQL + `
SELECT ` + jobColumnsNoRequest + `, true FROM c
UNION ALL
SELECT ` + jobColumnsNoRequest + `, false FROM jobs WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)
	AND NOT EXISTS (SELECT FROM c)`

// cancelLockedSQL ends the CTE live (the rows to cancel, locked: live_id, from_status,
// from_reason) with the CTEs that cancel them (c: the rows canceled, jobs.* with from_status and
// from_reason) and append their 'canceled' events ({"from": ..., "previous_reason": ...}), for
// cancelSQL and cancelPageSQL: a job canceled alone or with its page is canceled alike. A job
// of the batch lane not running (waiting for a provider batch, or in one not yet sent: batch_state
// waiting or committed) shows batch_state canceled: no batch of it reaches the provider (one
// whose batch's send was under way follows the batch's state from its next poll, as one canceled
// after the send does). The condition reads lane and status, not batch_state's values: the
// statement would otherwise hold 'committed', which tests' holds on "commit" would match.
const cancelLockedSQL = `
), c AS (
	UPDATE jobs SET status = 'canceled', next_attempt_at = NULL, finished_at = now(), updated_at = now(),
		dead_reason = NULL, event_seq = event_seq + 1,
		batch_state = CASE WHEN lane = 'batch' AND jobs.status IN ('queued', 'retrying') THEN 'canceled' ELSE batch_state END
	FROM live WHERE id = live_id
	RETURNING jobs.*, from_status, from_reason
), e AS (
	INSERT INTO job_events (job_id, seq, type, payload)
	SELECT id, event_seq, 'canceled', jsonb_strip_nulls(jsonb_build_object('from', from_status, 'previous_reason', from_reason))
	FROM c
)`

// cancelTries bounds cancel's runs of cancelSQL. A run whose job ended while it waited for the
// lock is run again, and the next one reads that end: a job that succeeded, failed or was
// canceled never becomes live again (only a dead one does, retried, and a dead row is locked).
// Past them cancel answers ErrBusy, which the API answers 503 job_busy with Retry-After: the
// client's next try is likely to find the job left alone.
const cancelTries = 3

// cancel is Cancel of id, of tenant's job alone unless tenant is nil.
func (s *Store) cancel(ctx context.Context, id string, tenant *string) (*Job, error) {
	if !ValidID(id) {
		return nil, ErrNotFound
	}
	for run := 1; run <= cancelTries; run++ {
		if s.beforeCancelRun != nil {
			s.beforeCancelRun(ctx, run)
		}
		var ours bool
		job, err := s.scanJob(s.pool.QueryRow(ctx, cancelSQL, id, tenant), &ours)
		switch {
		case errors.Is(err, ErrNotFound):
			return nil, err
		case err != nil:
			return nil, fmt.Errorf("cancel job: %w", err)
		case ours:
			return job, nil
		case job.Status.Terminal() && job.Status != StatusDead:
			return nil, &TerminalError{Status: job.Status, Job: job}
		}
		// Live or dead in the snapshot, and not locked as such: it ended while the lock was
		// waited for. Run again, to read how.
	}
	return nil, fmt.Errorf("cancel job: %w (%d tries)", ErrBusy, cancelTries)
}
