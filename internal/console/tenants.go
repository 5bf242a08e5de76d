package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/offboard"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/tenant"
)

func (h *Handler) tenantList(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	list, err := h.tenants.List(r.Context())
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	if list == nil {
		list = []tenant.Tenant{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tenants": list})
}

type tenantRequest struct {
	Name string `json:"name"`
	// Credentials limits the tenant's jobs to these; null or absent: every credential. An empty
	// list is refused.
	Credentials []string `json:"credentials"`
	// Weight is the tenant's share of a credential against other tenants with work (see
	// tenant.Tenant.Weight): a whole number in 1..tenant.MaxWeight, as ctl tenants create
	// --weight takes; absent or null: tenant.DefaultWeight. Read by parseWeight, so that 0 and a
	// non-number are invalid_weight as the weight action's are.
	Weight json.RawMessage `json:"weight"`
}

// tenantCreate creates a tenant and answers its bearer token, which is shown this once.
func (h *Handler) tenantCreate(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	var req tenantRequest
	err := readJSON(r, &req)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	for _, c := range req.Credentials {
		if !slices.ContainsFunc(h.cfg.Credentials, func(cc Credential) bool { return cc.Name == c }) {
			writeError(w, r, h.cfg.Logger, badRequest("unknown_credential", fmt.Sprintf("credential %q is not in the config", c)))
			return
		}
	}
	if req.Credentials != nil && len(req.Credentials) == 0 {
		// As ctl refuses an empty --credentials: an empty list asks for no credential, and
		// widening it to every one would grant the opposite.
		writeError(w, r, h.cfg.Logger, badRequest("invalid_credentials",
			"credentials: name at least one credential, or send null (or no field) for all of them"))
		return
	}
	weight := tenant.DefaultWeight
	if len(req.Weight) > 0 && string(req.Weight) != "null" {
		if weight, err = parseWeight(req.Weight); err != nil {
			writeError(w, r, h.cfg.Logger, err)
			return
		}
	}
	t, token, err := h.tenants.CreateWeighted(r.Context(), req.Name, req.Credentials, weight)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	h.audit(r, s.Operator, audit.Entry{Action: "tenant.create", Target: t.Name, Count: 1,
		Detail: map[string]any{"credentials": t.Credentials, "weight": t.Weight}})
	writeJSON(w, http.StatusCreated, map[string]any{"tenant": t, "token": token})
}

// tenantRevoke revokes a tenant. Body (optional) {"cancel_jobs": true}: also cancel every job of
// the tenant that has not ended (their tasks aborted: a call in flight stops), as `ctl tenants
// revoke --cancel-jobs` does, those a replica accepted while the revocation reached it included
// (the answer then comes once the replicas' caches have let go of the tenant: up to
// Config.RevokeSettle after the revocation), and its dead letters ("dead_letters" counts them
// among "canceled"), which no retry of the dead letters then sends; a tenant revoked already has
// its jobs canceled all the same. Cancels that stopped before the end (Postgres failed, or
// Config.ActionTimeout cut them: offboard.ErrIncomplete) answer the error writeError gives theirs
// (503 unavailable, or 500), its message saying what was done and that not every job of the
// tenant may be canceled: cancel its jobs again (ctl's "run again"). Audited as ctl does: tenant.revoke when it revoked (a revocation that changed
// nothing is not an action), tenant.cancel_jobs with the jobs canceled.
func (h *Handler) tenantRevoke(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	var req struct {
		CancelJobs bool `json:"cancel_jobs"`
	}
	if r.ContentLength != 0 { // the page's plain revoke sends no body
		if err := readJSON(r, &req); err != nil {
			writeError(w, r, h.cfg.Logger, err)
			return
		}
	}
	name := r.PathValue("name")
	was, err := h.tenants.Revoke(r.Context(), name)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	msg := "tenant " + name + " revoked"
	if !was {
		msg = "tenant " + name + " was revoked already"
	} else {
		h.audit(r, s.Operator, audit.Entry{Action: "tenant.revoke", Target: name, Count: 1})
	}
	answer := map[string]any{"message": msg, "changed": was}
	if req.CancelJobs {
		n, dead, err := h.cancelTenantJobs(r, s, name)
		if errors.Is(err, offboard.ErrIncomplete) {
			// As ctl's "run again": the revocation and the cancels made stand, and a second
			// cancel passes over those and cancels the rest.
			if ae := errorAnswer(r, h.cfg.Logger, err); ae != nil {
				err = &apiError{status: ae.status, typ: ae.typ, header: ae.header, message: fmt.Sprintf("%s; canceled %d jobs of it before the cancels stopped (%s): "+
					"not every job of it may be canceled: cancel its jobs again", msg, n, strings.TrimSuffix(ae.message, "; try again shortly"))}

			}
		}
		if err != nil {
			writeError(w, r, h.cfg.Logger, err)
			return
		}
		answer["message"], answer["canceled"] = fmt.Sprintf("%s; canceled %d jobs of it", msg, n), n
		if dead > 0 {
			answer["message"] = fmt.Sprintf("%s (%d of them dead letters, which no retry sends now)", answer["message"], dead)
			answer["dead_letters"] = dead
		}
		answer["changed"] = was || n > 0
	}
	writeJSON(w, http.StatusOK, answer)
}

// cancelTenantJobs cancels the jobs of revoked tenant name that have not ended, and its dead
// letters, as `ctl tenants revoke --cancel-jobs` does (offboard.CancelJobs: the last walk
// Config.RevokeSettle after its revocation), and audits how many it canceled (when it was not
// interrupted, or canceled some). It returns them and how many of them were dead letters.
func (h *Handler) cancelTenantJobs(r *http.Request, s *operator.Session, name string) (n, dead int, err error) {
	n, dead, err = offboard.CancelJobs(r.Context(), h.tenants, h.cfg.Jobs, name, h.cfg.RevokeSettle, h.canceledOfTenant(r),
		h.abortOfTenant(r))
	if n > 0 || err == nil {
		// Recorded even when the request was cut (h.audit outlives it): those jobs are canceled.
		h.audit(r, s.Operator, offboard.CancelJobsEntry(name, n, dead))
	}
	return n, dead, err
}

// canceledOfTenant is told each job of a tenant's that the console canceled: it counts it, as
// the console's cancels, and aborts its task. As a job's cancel, the job is canceled whatever
// Redis says (an attempt in flight stops, unstored, at its lease's next renewal), and nothing
// waits for a stalled Redis past dispatch.RedisWait.
func (h *Handler) canceledOfTenant(r *http.Request) func(*jobs.Job) error {
	abort := h.abortOfTenant(r)
	return func(job *jobs.Job) error {
		if h.cfg.Canceled != nil {
			h.cfg.Canceled(job.Credential)
		}
		return abort(job)
	}
}

// abortOfTenant aborts the task of a tenant's canceled job, as canceledOfTenant does, without
// counting it: for the jobs canceled before whose attempt may still be in flight
// (offboard.CancelJobs' abortInFlight, offboard.Options.AbortInFlight).
func (h *Handler) abortOfTenant(r *http.Request) func(*jobs.Job) error {
	return func(job *jobs.Job) error {
		if h.cfg.Tasks == nil {
			return nil
		}
		if err := h.cfg.AfterCommit.Run(func() error { return h.cfg.Tasks.AbortEnded(job) }); err != nil {
			h.cfg.Logger.WarnContext(r.Context(), "console: abort canceled job's task", "job_id", job.ID, "error", err)
		}
		return nil
	}
}

// tenantDelete deletes a revoked tenant, as `ctl tenants delete` does (package offboard, the
// same rules): its jobs that have not ended are canceled (their tasks aborted) once the
// revocation has reached every API replica (up to Config.RevokeSettle after it), every job of it
// is deleted with its attempts, events and idempotency keys, then the tenant and its tokens; the
// name may be given to a new tenant. Audited as ctl audits it (offboard.Result.AuditEntries),
// also when it stopped halfway. A tenant not revoked is 409 tenant_not_revoked, the anonymous
// requests' tenant 409 anonymous_tenant; jobs left (in a provider batch still open, or being
// changed) keep the tenant: 409 tenant_has_jobs, with what was deleted, and a later deletion
// finishes it. A deletion cut by Config.ActionTimeout (a backlog of many jobs) is 503: what it
// deleted stays deleted, and the next one goes on.
func (h *Handler) tenantDelete(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	name := r.PathValue("name")
	res, err := offboard.DeleteTenant(r.Context(), h.tenants, h.cfg.Jobs, name,
		offboard.Options{Settle: h.cfg.RevokeSettle, Abort: h.canceledOfTenant(r), AbortInFlight: h.abortOfTenant(r)})
	for _, e := range res.AuditEntries(name) {
		h.audit(r, s.Operator, e)
	}
	switch {
	case errors.Is(err, tenant.ErrNotRevoked):
		err = &apiError{status: http.StatusConflict, typ: "tenant_not_revoked", message: fmt.Sprintf("tenant %s is not revoked: only a revoked tenant is deleted (revoke it and cancel its jobs first)", name)}

	case errors.Is(err, tenant.ErrAnonymousTenant):
		err = &apiError{status: http.StatusConflict, typ: "anonymous_tenant", message: err.Error()}
	case err == nil && res.Kept():
		err = &apiError{status: http.StatusConflict, typ: "tenant_has_jobs", message: fmt.Sprintf("canceled %d and deleted %d jobs of tenant %s, which is kept: "+
			"%d of its jobs are left (%d not ended, %d in a provider batch still open or being changed; the batch lane cancels a batch "+
			"none of whose jobs waits): delete it again later", res.Canceled, res.Deleted, name, res.Unfinished+res.Left, res.Unfinished, res.Left)}

	}
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"message": fmt.Sprintf("tenant %s deleted, with %d jobs and its tokens (%d jobs canceled first)",
		name, res.Deleted, res.Canceled), "changed": true, "canceled": res.Canceled, "jobs_deleted": res.Deleted})
}

// tenantRotate gives a tenant a new bearer token, answered this once, as tenantCreate does. Body
// {"overlap_seconds": N}: how long the old token keeps working (0: it ends at once; absent:
// tenant.DefaultOverlap). A token still in an earlier rotation's overlap ends at once.
func (h *Handler) tenantRotate(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	var req struct {
		// OverlapSeconds is read by parseOverlap, so that a value of another type is
		// invalid_overlap naming the field, as one out of range is.
		OverlapSeconds json.RawMessage `json:"overlap_seconds"`
	}
	if err := readJSON(r, &req); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	overlap, err := parseOverlap(req.OverlapSeconds)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	name := r.PathValue("name")
	rot, err := h.tenants.Rotate(r.Context(), name, overlap)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	h.audit(r, s.Operator, audit.Entry{Action: "tenant.rotate", Target: name, Count: 1,
		Detail: map[string]any{"overlap": overlap.String(), "previous_ends_at": rot.PreviousEnds.UTC().Format(time.RFC3339), "ended": rot.Ended}})
	writeJSON(w, http.StatusOK, map[string]any{"tenant": rot.Tenant, "token": rot.Token,
		"previous_token_ends_at": rot.PreviousEnds.UTC(), "ended": rot.Ended})
}

// tenantWeight changes a tenant's weight: its share of a credential against other tenants with
// work waiting on it (workers apply it within seconds).
func (h *Handler) tenantWeight(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	var req struct {
		Weight json.RawMessage `json:"weight"`
	}
	if err := readJSON(r, &req); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	weight, err := parseWeight(req.Weight)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	name := r.PathValue("name")
	if err := h.tenants.SetWeight(r.Context(), name, weight); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	h.audit(r, s.Operator, audit.Entry{Action: "tenant.weight", Target: name, Count: 1,
		Detail: map[string]any{"weight": weight}})
	writeJSON(w, http.StatusOK, map[string]any{"message": fmt.Sprintf("tenant %s: weight %d", name, weight), "changed": true})
}

// parseOverlap reads a rotation's overlap_seconds: absent or null is tenant.DefaultOverlap, a
// whole number of seconds in 0..tenant.MaxOverlap that duration; anything else is
// invalid_overlap naming the value and the range.
func parseOverlap(raw json.RawMessage) (time.Duration, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return tenant.DefaultOverlap, nil
	}
	maxSeconds := int64(tenant.MaxOverlap / time.Second)
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil || n < 0 || n > maxSeconds {
		return 0, badRequest("invalid_overlap", fmt.Sprintf("overlap_seconds %s: want a whole number of seconds in 0..%d",
			truncateRaw(raw), maxSeconds))
	}
	return time.Duration(n) * time.Second, nil
}

// truncateRaw is raw, a client's JSON value, cut to 40 characters to quote in a message.
func truncateRaw(raw json.RawMessage) string {
	v := []rune(string(raw))
	if len(v) > 40 {
		v = append(v[:40], '…')
	}
	return string(v)
}

// parseWeight reads the weight action's "weight" (and a create's, when it sends one): a whole
// number in 1..tenant.MaxWeight, as ctl tenants set --weight takes. Anything else (absent, null,
// a string, a fraction, a number past the range) is 400 invalid_weight naming the field, the
// value and the range: decoded into an int, an absent or null weight was the 0 the client never
// sent ("invalid weight: 0"), and a string or a fraction an invalid_body naming a Go type.
func parseWeight(raw json.RawMessage) (int, error) {
	want := fmt.Sprintf("a whole number in 1..%d", tenant.MaxWeight)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, badRequest("invalid_weight", "weight is required: "+want)
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil || n < 1 || n > tenant.MaxWeight {
		return 0, badRequest("invalid_weight", fmt.Sprintf("weight %s: want %s", truncateRaw(raw), want))
	}
	return n, nil
}

// auditListMaxLimit is the largest page of the audit log; auditListLimit is its default.
const (
	auditListMaxLimit = 500
	auditListLimit    = 100
)

// auditList serves a page of the audit log, newest first: ?operator=&action=&limit=&after=
// (after: the "next" of the previous page, "" on the last one, as the job list's), the filters
// ctl audit's --operator and --action (one action or a comma list, each one of audit.Actions:
// else 400 invalid_filter naming them). A page with an action filter reads at most
// audit.PageScanRows entries, and may come back short or empty with a next (see
// audit.ListPage); the answer says the bound (scan_rows) and the known actions (actions), for
// the page's select. An unknown parameter is refused (400 invalid_parameter), as the other
// lists'.
func (h *Handler) auditList(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	q := r.URL.Query()
	if err := checkParams(q, "operator", "action", "limit", "after"); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	if err := checkFilter("operator", q.Get("operator")); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	var actions []string
	if v := q.Get("action"); v != "" {
		actions = strings.Split(v, ",")
		if err := audit.CheckActions(actions); err != nil {
			writeError(w, r, h.cfg.Logger, badRequest("invalid_filter", err.Error()))
			return
		}
	}
	limit, given, err := queryLimit(q, auditListMaxLimit)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	if !given {
		limit = auditListLimit
	}
	page, err := audit.ListPage(r.Context(), h.cfg.Pool, audit.ListParams{Operator: q.Get("operator"), Actions: actions,
		Limit: limit, After: q.Get("after")})
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	if page.Entries == nil {
		page.Entries = []audit.Entry{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": page.Entries, "limit": limit, "next": page.Next,
		"actions": audit.Actions(), "scan_rows": audit.PageScanRows})
}
