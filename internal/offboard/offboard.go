// Package offboard ends a revoked tenant's work and deletes it with its jobs: the procedures that
// `ctl tenants revoke --cancel-jobs` and `ctl tenants delete` and the console's equivalents both
// run, so that they follow the same rules and are audited alike.
package offboard

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tenant"
)

// Options configure a deletion.
type Options struct {
	// Settle is how long after the tenant's revocation the last walk for jobs to cancel comes:
	// the API replicas' Authenticator TTL and a second (tenant.DefaultCacheTTL + 1s), after which
	// no replica accepts a submit of the tenant any more. A revocation older than that is not
	// waited for.
	Settle time.Duration
	// Abort, when set, is called with each job canceled, to stop its task (a call in flight).
	// A failure does not stop the cancels (the job is canceled; an attempt in flight runs to its
	// end, unstored) but stops the deletion before it begins: DeleteTenant returns it, with the
	// Result of the cancels, and a later call, which finds those jobs ended, deletes them.
	Abort func(*jobs.Job) error
	// AbortInFlight, when set, is called first with each of the tenant's canceled jobs whose
	// attempt may still be in flight (jobs.Store.AbortInFlightOfTenant), to stop its task: those
	// of a page of cancels whose commit's answer was lost, on a rerun. It only aborts (the jobs
	// are not counted as canceled); a failure is Abort's.
	AbortInFlight func(*jobs.Job) error
	// Batch is how many jobs one transaction deletes. Default 500.
	Batch int
	// Canceled, when set, is told how many jobs were canceled once the cancels are done (when
	// some were), before the deletion begins.
	Canceled func(n int)
	// Progress, when set, is told the jobs deleted so far after each full batch (more may follow).
	Progress func(deleted int64)
}

// Result is what a deletion did, also when it stopped halfway.
type Result struct {
	// Canceled counts the tenant's jobs it canceled.
	Canceled int
	// Deleted counts the tenant's jobs it deleted, with their attempts, events and keys.
	Deleted int64
	// TenantDeleted reports whether the tenant and its tokens are gone.
	TenantDeleted bool
	// Unfinished and Left count the jobs that kept the tenant (TenantDeleted false, no error):
	// jobs not ended (submitted meanwhile, or being changed), and ended ones in a provider batch
	// still open or locked by a change under way. A later deletion finishes it.
	Unfinished, Left int
}

// AuditEntries are the audit log's entries of r, for the caller to write with its operator,
// whether the deletion finished or not: tenant.cancel_jobs with the jobs canceled (when some
// were), and tenant.delete with count 1 when the tenant was deleted, 0 when only some of its
// jobs were (Detail "jobs_deleted" says how many). A deletion that changed nothing has none.
func (r Result) AuditEntries(name string) []audit.Entry {
	var out []audit.Entry
	if r.Canceled > 0 {
		out = append(out, CancelJobsEntry(name, r.Canceled, 0))
	}
	if r.Deleted > 0 || r.TenantDeleted {
		n := 0
		if r.TenantDeleted {
			n = 1
		}
		out = append(out, audit.Entry{Action: "tenant.delete", Target: name, Count: n,
			Detail: map[string]any{"jobs_deleted": r.Deleted}})
	}
	return out
}

// Kept reports whether jobs left kept the tenant (see Result.Unfinished and Left).
func (r Result) Kept() bool { return !r.TenantDeleted && r.Unfinished+r.Left > 0 }

// DeleteTenant deletes revoked tenant name: it cancels the tenant's jobs that have not ended
// (jobs.Store.CancelTenant, walking them once more Options.Settle after the revocation), deletes
// its jobs in batches with their attempts, events and idempotency keys
// (jobs.Store.DeleteEndedOfTenant), then, when none is left, the tenant and its tokens
// (tenant.Store.Delete). Jobs left (in a provider batch still open, or being changed) keep the
// tenant: the Result counts them (Kept) and a later call finishes the deletion.
//
// Errors, before anything is changed: tenant.ErrAnonymousTenant (tenant.Default),
// tenant.ErrNotFound, tenant.ErrNotRevoked. Any later error comes with the Result of what was
// done before it, which the caller audits (Result.AuditEntries).
func DeleteTenant(ctx context.Context, tenants *tenant.Store, store *jobs.Store, name string, o Options) (Result, error) {
	var res Result
	if name == tenant.Default {
		return res, fmt.Errorf("%w: %q answers anonymous requests as stored (api.allow_anonymous): deleted, they would be let in again",
			tenant.ErrAnonymousTenant, name)
	}
	if o.Batch <= 0 {
		o.Batch = 500
	}
	since, err := tenants.RevokedFor(ctx, name)
	if err != nil {
		return res, err
	}
	var inFlightErr error
	if o.AbortInFlight != nil {
		if inFlightErr = store.AbortInFlightOfTenant(ctx, name, o.AbortInFlight); !abortsFailed(inFlightErr) {
			return res, inFlightErr
		}
	}
	settle := time.NewTimer(max(0, o.Settle-since))
	defer settle.Stop()
	res.Canceled, err = store.CancelTenant(ctx, name, settle.C, o.Abort)
	if res.Canceled > 0 && o.Canceled != nil {
		o.Canceled(res.Canceled)
	}
	if err = errors.Join(inFlightErr, err); err != nil {
		return res, err
	}
	for {
		n, err := store.DeleteEndedOfTenant(ctx, name, o.Batch)
		res.Deleted += n
		if err != nil {
			return res, fmt.Errorf("deletion stopped after %d jobs: %w", res.Deleted, err)
		}
		if n < int64(o.Batch) {
			break
		}
		if o.Progress != nil {
			o.Progress(res.Deleted)
		}
	}
	if res.Unfinished, res.Left, err = store.RemainingOfTenant(ctx, name); err != nil {
		return res, err
	}
	if res.Unfinished+res.Left > 0 {
		return res, nil
	}
	if err := tenants.Delete(ctx, name); err != nil {
		return res, err
	}
	res.TenantDeleted = true
	return res, nil
}

// CancelJobs cancels the jobs of revoked tenant name: those that have not ended
// (jobs.Store.CancelTenant, walking them once more settle after the revocation, on Postgres's
// clock: at once for a revocation older than that), then, whether that went well or not, its
// dead letters (jobs.Store.CancelDeadOfTenant), which an operator's retry of every dead letter
// would otherwise send again and pay for. abort (when not nil) is called with each job canceled;
// abortInFlight (when not nil) first with each of the tenant's canceled jobs whose attempt may
// still be in flight (jobs.Store.AbortInFlightOfTenant: those a run whose page's commit answer
// was lost canceled without aborting them), which it does not count.
// Interrupted (ctx ended) during the first pass, it does not begin the second.
// It returns how many jobs it canceled and how many of them were dead letters, also with an error
// (the caller audits them: CancelJobsEntry). Errors: tenant.ErrNotFound, tenant.ErrNotRevoked, or
// what the cancels returned (both passes' failures, joined, when both failed; said once when it
// is one failure of Postgres: unreachable, or one error it answered both), which Is
// ErrIncomplete unless only aborts failed (a later call then cancels the rest).
func CancelJobs(ctx context.Context, tenants *tenant.Store, store *jobs.Store, name string, settle time.Duration,
	abort, abortInFlight func(*jobs.Job) error) (n, dead int, err error) {
	since, err := tenants.RevokedFor(ctx, name)
	if err != nil {
		return 0, 0, err
	}
	var inFlightErr error
	if abortInFlight != nil {
		if inFlightErr = store.AbortInFlightOfTenant(ctx, name, abortInFlight); !abortsFailed(inFlightErr) {
			return 0, 0, incompleteError{inFlightErr}
		}
	}
	timer := time.NewTimer(max(0, settle-since))
	defer timer.Stop()
	n, err = store.CancelTenant(ctx, name, timer.C, abort)
	err = joinAborts(inFlightErr, err)
	if err != nil && ctx.Err() != nil {
		// Interrupted: the dead letters' pass could only fail alike (and the error said "context
		// canceled" twice). The next call cancels them.
		return n, 0, incompleteError{err}
	}
	// The dead letters even when that failed: an abort that failed (Redis down) left its job
	// canceled, and a failure of Postgres fails this pass too, at once. Skipped, they waited for
	// the operator to run the command again, and a retry of every dead letter sent them meanwhile.
	dead, deadErr := store.CancelDeadOfTenant(ctx, name, abort)
	joined := errors.Join(err, deadErr)
	if sameFailure(err, deadErr) {
		// Postgres down fails both passes alike: said twice, it was a wall of text for one
		// refused connection.
		joined = fmt.Errorf("%w; its dead letters' pass failed alike", err)
	}
	if stopped(err) || stopped(deadErr) {
		joined = incompleteError{joined}
	}
	return n + dead, dead, joined
}

// CancelJobsEntry is the audit log's entry of n jobs of tenant name canceled, dead of them dead
// letters (Detail "dead_letters", when some were).
func CancelJobsEntry(name string, n, dead int) audit.Entry {
	e := audit.Entry{Action: "tenant.cancel_jobs", Target: name, Count: n}
	if dead > 0 {
		e.Detail = map[string]any{"dead_letters": dead}
	}
	return e
}

// ErrIncomplete is what CancelJobs' error Is when the cancels stopped before they ended (Postgres
// failed, or ctx ended): some of the tenant's jobs or dead letters may be left, which a later
// call cancels (it passes over those canceled so far, and waits out only what is left of the
// settle). It is not when only aborts failed (jobs.AbortError): every job was canceled, and a
// later call aborts again only the tasks of canceled jobs whose attempt may still be in flight
// (as it does those of a page whose commit's answer was lost, see jobs.Store.CancelTenant). The
// error's text is its cause's.
var ErrIncomplete = errors.New("cancels incomplete")

// incompleteError is an error of CancelJobs that Is ErrIncomplete, with its cause's text.
type incompleteError struct{ err error }

func (e incompleteError) Error() string        { return e.err.Error() }
func (e incompleteError) Unwrap() error        { return e.err }
func (e incompleteError) Is(target error) bool { return target == ErrIncomplete }

// sameFailure reports whether both passes stopped on what is one failure of Postgres: it
// answered both with one error (code and message), or it answered neither, unreachable
// (jobs.IsUnavailable). Two answers that differ are two failures, each said, though both be
// "unavailable" (a statement timeout, then a full disk).
func sameFailure(err, deadErr error) bool {
	if !stopped(err) || !stopped(deadErr) {
		return false
	}
	var pgErr, deadPgErr *pgconn.PgError
	switch answered, deadAnswered := errors.As(err, &pgErr), errors.As(deadErr, &deadPgErr); {
	case answered && deadAnswered:
		return pgErr.Code == deadPgErr.Code && pgErr.Message == deadPgErr.Message
	case answered || deadAnswered:
		return false
	}
	return jobs.IsUnavailable(err) && jobs.IsUnavailable(deadErr)
}

// abortsFailed reports whether err is nil or only aborts that failed (jobs.AbortError).
func abortsFailed(err error) bool {
	var abortErr *jobs.AbortError
	return err == nil || errors.As(err, &abortErr)
}

// joinAborts joins inFlight, AbortInFlightOfTenant's aborts that failed (or nil), with err,
// CancelTenant's: err alone when it stopped the pass (the aborts are retried with the rerun it
// asks for), so that stopped and sameFailure read it as before.
func joinAborts(inFlight, err error) error {
	if inFlight == nil || stopped(err) {
		return err
	}
	if err == nil {
		return inFlight
	}
	return errors.Join(inFlight, err)
}

// stopped reports whether err, a cancel pass's, stopped it before it ended: any failure but
// aborts that failed (jobs.AbortError, returned once every cancel was made).
func stopped(err error) bool {
	var abortErr *jobs.AbortError
	return err != nil && !errors.As(err, &abortErr)
}
