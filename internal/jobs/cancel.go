package jobs

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// TerminalError is returned when a job cannot change because it already ended; Status is the
// status it ended in.
type TerminalError struct {
	Status Status
}

func (e *TerminalError) Error() string { return "job is " + string(e.Status) }

// AlreadyCanceled reports whether err is Cancel's answer for a job that a cancel had already
// ended: the caller's cancel is done, by an earlier one (its own, whose answer it lost, say).
func AlreadyCanceled(err error) bool {
	var te *TerminalError
	return errors.As(err, &te) && te.Status == StatusCanceled
}

// Cancel moves a queued, retrying, running or dead job to canceled and appends the event, in one
// transaction under the job's row lock. It returns the canceled job, ErrNotFound (also for a
// malformed ID), or a *TerminalError naming the status of a job that had already ended otherwise
// (see AlreadyCanceled: one canceled before changes nothing, appends nothing).
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

// cancel is Cancel of id, of tenant's job alone unless tenant is nil.
func (s *Store) cancel(ctx context.Context, id string, tenant *string) (*Job, error) {
	if !ValidID(id) {
		return nil, ErrNotFound
	}
	var job *Job
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var status Status
		var reason *string
		// The row lock orders this against the worker's transitions and an operator's retry.
		// Another tenant's row does not match, and is not locked.
		err := tx.QueryRow(ctx, `SELECT status, dead_reason FROM jobs WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)
FOR UPDATE`, id, tenant).Scan(&status, &reason)
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		if status.Terminal() && status != StatusDead {
			return &TerminalError{Status: status}
		}
		job, err = s.scanJob(tx.QueryRow(ctx, `
UPDATE jobs SET status = 'canceled', next_attempt_at = NULL, finished_at = now(), updated_at = now(),
	dead_reason = NULL, event_seq = event_seq + 1
WHERE id = $1
RETURNING `+jobColumns, id))
		if err != nil {
			return err
		}
		payload := map[string]any{"from": status}
		if reason != nil {
			payload["previous_reason"] = *reason
		}
		return appendEvent(ctx, tx, job.ID, job.EventSeq, StatusCanceled, payload)
	})
	var te *TerminalError
	if errors.Is(err, ErrNotFound) || errors.As(err, &te) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("cancel job: %w", err)
	}
	return job, nil
}
