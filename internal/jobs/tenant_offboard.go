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
SELECT count(*) FROM d`

// CancelTenant cancels every job of the tenant that has not ended (as Cancel does one), walking
// them page by page, and calls abort (when not nil) with each job it canceled, to stop its task
// (a call in flight); once settled has fired it walks them once more from the start (at once,
// if it fired before the first walk began): API replicas may accept the tenant's submits until
// its revocation reaches them (their Authenticator's TTL). It returns how many it canceled; a
// job that ended meanwhile is left as it ended. An abort that fails does not stop it (its job
// is canceled: an attempt in flight runs to its end, unstored); the first such failure is
// returned at the end, with their count (*AbortError).
func (s *Store) CancelTenant(ctx context.Context, tenant string, settled <-chan time.Time, abort func(*Job) error) (int, error) {
	const page = 500
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
		var after TenantCursor
		for {
			ids, next, err := s.UnfinishedOfTenant(ctx, tenant, after, page)
			if err != nil {
				return t.n, err
			}
			if err := s.cancelEach(ctx, ids, abort, &t); err != nil {
				return t.n, err
			}
			if len(ids) < page {
				break
			}
			after = next
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
// once, oldest death first (jobs_finished_idx, in the order RetryDead locks them), and returns
// how many it canceled; a job retried meanwhile (queued again) is canceled as well, one purged
// or otherwise ended meanwhile is left alone. An abort that fails does not stop it; the first
// such failure is returned at the end, with their count (*AbortError).
func (s *Store) CancelDeadOfTenant(ctx context.Context, tenant string, abort func(*Job) error) (int, error) {
	const page = 500
	var t cancelTally
	at, after := time.Time{}, uuid.Nil.String()
	for {
		rows, err := s.pool.Query(ctx, `SELECT id::text, finished_at FROM jobs
WHERE status = 'dead' AND finished_at IS NOT NULL AND tenant = $1 AND (finished_at, id) > ($2, $3::uuid)
ORDER BY finished_at, id LIMIT $4`, tenant, at, after, page)
		if err != nil {
			return t.n, fmt.Errorf("read the tenant's dead jobs: %w", err)
		}
		ids, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
			err := r.Scan(&after, &at)
			return after, err
		})
		if err != nil {
			return t.n, fmt.Errorf("read the tenant's dead jobs: %w", err)
		}
		if err := s.cancelEach(ctx, ids, abort, &t); err != nil {
			return t.n, err
		}
		if len(ids) < page {
			break
		}
	}
	if t.abortErr != nil {
		return t.n, &AbortError{Unaborted: t.unaborted, Err: t.abortErr, Dead: true}
	}
	return t.n, nil
}

// AbortError is the error of CancelTenant and CancelDeadOfTenant when every cancel was made but
// abort failed for some of the jobs canceled (an attempt in flight runs to its end, unstored): a
// later call aborts nothing more, as those jobs have ended. It unwraps to the first failure.
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
		t.n++
		if abort == nil {
			continue
		}
		if err := abort(job); err != nil {
			if t.unaborted++; t.abortErr == nil {
				t.abortErr = fmt.Errorf("job %s: %w", job.ID, err)
			}
		}
	}
	return nil
}
