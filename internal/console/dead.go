package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/operator"
)

// deadListLimit caps the dead letters listed at once (most recently dead first); ?limit= asks
// for fewer.
const deadListLimit = 200

// deadList serves the dead letters, a page at a time: ?reason=&credential=&limit=&after= (after:
// the "next" of the previous page, which is "" on the last one, as the job list's). A reason that is none of
// jobs.DeadReasons is refused (400 invalid_reason), as ctl's --reason: it would match nothing.
func (h *Handler) deadList(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	q := r.URL.Query()
	if err := checkParams(q, "reason", "credential", "limit", "after"); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	for _, name := range []string{"reason", "credential"} {
		if err := checkFilter(name, q.Get(name)); err != nil {
			writeError(w, r, h.cfg.Logger, err)
			return
		}
	}
	if reason := q.Get("reason"); reason != "" && !jobs.ValidDeadReason(reason) {
		writeError(w, r, h.cfg.Logger, badRequest("invalid_reason", fmt.Sprintf("reason %q is not a dead reason: want %s",
			reason, strings.Join(jobs.DeadReasons(), " or "))))
		return
	}
	limit, given, err := queryLimit(q, deadListLimit)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	if !given {
		limit = deadListLimit
	}
	page, err := h.cfg.Jobs.PageDead(r.Context(), jobs.DeadFilter{Reason: q.Get("reason"),
		Credential: q.Get("credential"), Limit: limit}, q.Get("after"))
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": views(page.Jobs), "limit": limit, "next": page.Next})
}

// selection is the body of a dead-letter action: the jobs the operator selected.
type selection struct {
	IDs []string `json:"ids"`
}

// maxSelection caps a selection (one request, one transaction).
const maxSelection = 1000

func readSelection(r *http.Request) ([]string, error) {
	var s selection
	if err := readJSON(r, &s); err != nil {
		return nil, err
	}
	if len(s.IDs) == 0 || len(s.IDs) > maxSelection {
		return nil, badRequest("invalid_selection", fmt.Sprintf("select 1 to %d jobs", maxSelection))
	}
	// A job ID in either case names the job; the answer says what was done to each ID as the
	// store names it. An ID holding NUL names no job, and the audit log (text, jsonb) cannot
	// hold it: the entry of the action would be lost, so the whole selection is refused.
	for i, id := range s.IDs {
		if strings.ContainsRune(id, 0) {
			return nil, badRequest("invalid_selection", "a selected job ID holds NUL: no job has such an ID")
		}
		s.IDs[i] = jobs.CanonicalID(id)
	}
	slices.Sort(s.IDs)
	return slices.Compact(s.IDs), nil
}

// actionResult answers a dead-letter action: what was done, and why the rest was not.
type actionResult struct {
	Requested int      `json:"requested"`
	Done      []string `json:"done"`
	// Skipped names each selected job left alone and why (retried or purged meanwhile, ...).
	Skipped map[string]string `json:"skipped"`
}

// skipped explains each id of ids not in done, by reading the job again; deadWhy explains one
// still dead.
func (h *Handler) skipped(r *http.Request, ids, done []string, deadWhy func(job *jobs.Job) string) map[string]string {
	out := map[string]string{}
	for _, id := range ids {
		if slices.Contains(done, id) {
			continue
		}
		if !jobs.ValidID(id) {
			// A typo or a truncated copy: no job was ever purged under it.
			out[id] = "not a job ID"
			continue
		}
		job, err := h.cfg.Jobs.Get(r.Context(), id)
		switch {
		case err == nil && job.Status == jobs.StatusDead:
			out[id] = deadWhy(job)
		case err == nil:
			out[id] = "it is " + string(job.Status) + " now, no longer dead"
		case jobs.IsUnavailable(err) || r.Context().Err() != nil:
			out[id] = "could not be read"
		default:
			out[id] = "no such job (purged?)"
		}
	}
	return out
}

// deadRetry puts the selected dead jobs back to queued (with a fresh attempt budget) and
// enqueues them. A selected job that is no longer dead is left alone and named in "skipped".
func (h *Handler) deadRetry(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	ids, err := readSelection(r)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	// One batch longer than the selection: one statement, so one transaction (see maxSelection).
	// In batches, a failure after the first would answer an error over jobs already put back.
	retried, err := h.cfg.Jobs.RetryDead(r.Context(), jobs.DeadFilter{IDs: ids}, &jobs.RetryDeadOpts{Batch: len(ids) + 1})
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	done := make([]string, 0, len(retried))
	for _, job := range retried {
		done = append(done, job.ID)
	}
	if h.cfg.Tasks != nil {
		// Queued in Postgres: what Redis misses (an error, or a stall past dispatch.RedisWait,
		// which the answer does not wait for) the sweeper enqueues.
		ctx := context.WithoutCancel(r.Context())
		if err := h.cfg.AfterCommit.Run(func() error {
			var errs []error
			for _, job := range retried {
				if err := h.cfg.Tasks.Requeue(ctx, job.ID, job.Priority); err != nil {
					h.cfg.Logger.WarnContext(ctx, "console: requeue retried job (the sweeper will)", "job_id", job.ID, "error", err)
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		}); errors.Is(err, dispatch.ErrRedisWait) || errors.Is(err, dispatch.ErrAfterCommitFull) { // else each job's failure is logged above
			h.cfg.Logger.WarnContext(ctx, "console: requeue retried jobs (the sweeper will)", "jobs", len(retried), "error", err)
		}
	}
	res := actionResult{Requested: len(ids), Done: nonNil(done), Skipped: h.skipped(r, ids, done, func(job *jobs.Job) string {
		// RetryDead leaves a revoked tenant's dead letters dead (see docs/decisions.md), and the
		// jobs that died after it began.
		switch n, err := h.cfg.Jobs.CountDeadOfRevoked(r.Context(), jobs.DeadFilter{IDs: []string{job.ID}}); {
		case err != nil:
			return "could not be read"
		case n == 1:
			return fmt.Sprintf("its tenant %q is revoked: no retry sends its dead letters (cancel them)", job.Tenant)
		}
		return "it died after the retry began; retry it again"
	})}
	h.audit(r, s.Operator, audit.Entry{Action: "dead.retry", Target: audit.TargetOf(ids), Count: len(done),
		Detail: map[string]any{"requested": ids, "skipped": res.Skipped}})
	writeJSON(w, http.StatusOK, res)
}

// deadPurge deletes the selected dead jobs with their history. A selected job that is no
// longer dead is left alone and named in "skipped".
func (h *Handler) deadPurge(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	ids, err := readSelection(r)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	done, err := h.cfg.Jobs.PurgeDeadIDs(r.Context(), ids)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	res := actionResult{Requested: len(ids), Done: nonNil(done), Skipped: h.skipped(r, ids, done, func(*jobs.Job) string {
		return "another change held it; try again"
	})}
	h.audit(r, s.Operator, audit.Entry{Action: "dead.purge", Target: audit.TargetOf(ids), Count: len(done),
		Detail: map[string]any{"requested": ids, "skipped": res.Skipped}})
	writeJSON(w, http.StatusOK, res)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
