package console

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/llmq/llmq/internal/audit"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/operator"
)

// jobView is a job as the console shows it: the API's job JSON, its tenant, and the credential it
// is on.
type jobView struct {
	*jobs.Job
	Tenant string `json:"tenant"`
	// CurrentCredential is jobs.Job.CurrentCredential: the job's credential, or the fallback it
	// failed over to (the one that served its last attempt, that answered it or it died on;
	// waiting, the one its next attempt goes to). The credential filter selects a job by its own
	// and by every fallback it reached, so a row found by a fallback's filter names one.
	CurrentCredential string `json:"current_credential"`
}

// view is job as the console shows it.
func view(job *jobs.Job) jobView {
	return jobView{Job: job, Tenant: job.Tenant, CurrentCredential: job.CurrentCredential()}
}

// views are the rows of a list: without their results, which only the job page shows (a page
// of 50 answers could weigh megabytes).
func views(list []*jobs.Job) []jobView {
	out := make([]jobView, 0, len(list))
	for _, j := range list {
		row := *j
		row.Result = nil
		out = append(out, view(&row))
	}
	return out
}

// jobListMaxLimit is the largest page of the jobs list.
const jobListMaxLimit = 500

// jobList serves a page of jobs: ?status=&tenant=&credential=&after=<cursor>&limit=.
func (h *Handler) jobList(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	q := r.URL.Query()
	if err := checkParams(q, "status", "tenant", "credential", "after", "limit"); err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	p := jobs.PageParams{Status: jobs.Status(q.Get("status")), Tenant: q.Get("tenant"),
		Credential: q.Get("credential"), After: q.Get("after")}
	if p.Status != "" && !p.Status.Valid() {
		writeError(w, r, h.cfg.Logger, badRequest("invalid_status", "status "+strconv.Quote(string(p.Status))+
			" is not one of queued, running, retrying, succeeded, failed, dead, canceled"))
		return
	}
	for _, f := range []struct{ name, v string }{{"tenant", p.Tenant}, {"credential", p.Credential}} {
		if err := checkFilter(f.name, f.v); err != nil {
			writeError(w, r, h.cfg.Logger, err)
			return
		}
	}
	limit, _, err := queryLimit(q, jobListMaxLimit)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	p.Limit = limit // 0: not given, the store's default
	page, err := h.cfg.Jobs.Page(r.Context(), p)
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"jobs": views(page.Jobs), "next": page.Next})
}

// JobDetail is the job page: the job, a summary of its request, every attempt, every event.
type JobDetail struct {
	Job      jobView           `json:"job"`
	Request  RequestSummary    `json:"request"`
	Attempts []jobs.AttemptRow `json:"attempts"`
	Events   []jobs.Event      `json:"events"`
}

// RequestSummary describes a provider request without showing it whole.
type RequestSummary struct {
	Bytes     int    `json:"bytes"`
	Model     string `json:"model"`
	MaxTokens int    `json:"max_tokens,omitempty"`
	Stream    bool   `json:"stream,omitempty"`
	Messages  int    `json:"messages"`
	// FirstText is the start of the first message's text (at most 300 characters).
	FirstText string `json:"first_text,omitempty"`
}

func summarize(req []byte) RequestSummary {
	var body struct {
		Model     string `json:"model"`
		MaxTokens int    `json:"max_tokens"`
		Stream    bool   `json:"stream"`
		Messages  []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	s := RequestSummary{Bytes: len(req)}
	if json.Unmarshal(req, &body) != nil {
		return s
	}
	s.Model, s.MaxTokens, s.Stream, s.Messages = body.Model, body.MaxTokens, body.Stream, len(body.Messages)
	if len(body.Messages) > 0 {
		s.FirstText = firstText(body.Messages[0].Content)
	}
	return s
}

// firstText returns the text of a message's content: a string, or its first text block.
func firstText(c json.RawMessage) string {
	var text string
	if json.Unmarshal(c, &text) != nil {
		var blocks []struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(c, &blocks) != nil || len(blocks) == 0 {
			return ""
		}
		text = blocks[0].Text
	}
	if r := []rune(text); len(r) > 300 {
		return string(r[:299]) + "…"
	}
	return text
}

func (h *Handler) detail(ctx context.Context, id string) (*JobDetail, error) {
	job, err := h.cfg.Jobs.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	attempts, err := h.cfg.Jobs.Attempts(ctx, id)
	if err != nil {
		return nil, err
	}
	events, err := h.cfg.Jobs.Events(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	if attempts == nil {
		attempts = []jobs.AttemptRow{}
	}
	if events == nil {
		events = []jobs.Event{}
	}
	return &JobDetail{Job: view(job), Request: summarize(job.Request), Attempts: attempts, Events: events}, nil
}

func (h *Handler) jobDetail(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	d, err := h.detail(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// jobLive streams the job page as "job" events: at once, then after every transition of the
// job (announced by Postgres to the Listener; the stream watches the job so that its
// transitions are announced), whatever process made it. It stays open after the job ends: an
// operator may retry it. A job deleted meanwhile ends the stream with a "gone" event; a read that
// fails otherwise is tried again at the next wake-up.
// The stream ends with a "session_expired" event once its session has (see sessionEnded). It
// holds one of the process's event stream places while open (Config.OpenStream). A read before
// its first event that fails for a reason that passes tells an EventSource to come back
// (refuseStream). A wake-up whose signal names an event the page has read reads nothing (the
// Listener's catch-up after each of its reconnects signals the job's latest event: every open
// page read the job, three statements, for nothing); a keep-alive reads the job as before.
func (h *Handler) jobLive(w http.ResponseWriter, r *http.Request, _ *operator.Session) {
	release, ok := h.openStream(w, r)
	if !ok {
		return
	}
	defer release()
	ctx, cancel := h.readCtx(r.Context())
	job, err := h.cfg.Jobs.Get(ctx, r.PathValue("id"))
	cancel()
	if err != nil {
		h.refuseStream(w, r, err)
		return
	}
	// The ID as the store names it (the path's may be in capitals): the Listener signals that.
	id := job.ID
	var notify <-chan int
	if h.cfg.Listener != nil {
		ch, unsubscribe := h.cfg.Listener.Subscribe(id)
		defer unsubscribe()
		notify = ch
	}
	watchTTL := 4 * h.cfg.KeepAlive
	ctx, cancel = h.readCtx(r.Context())
	err = h.cfg.Jobs.Watch(ctx, id, watchTTL)
	cancel()
	if err != nil {
		h.refuseStream(w, r, err)
		return
	}
	out, ok := startStream(w, h.cfg.EventWriteTimeout)
	if !ok {
		return
	}
	keep := time.NewTicker(h.cfg.KeepAlive)
	defer keep.Stop()
	var last []byte
	// known is the latest event's number of the job as the page last read it (0: none read);
	// read is whether this pass reads the job: not when the Listener's signal names an event the
	// page has read (every event up to it is committed, and the page's read saw them), as the
	// signal after each of its reconnects does for a page that missed nothing.
	known, read := 0, true
	for {
		if h.sessionEnded(r) {
			endStream(out)
			return
		}
		if read {
			ctx, cancel := h.readCtx(r.Context())
			d, err := h.detail(ctx, id)
			cancel()
			switch {
			case err == nil:
				known = d.Job.EventSeq
				if last, err = sendIfChanged(out, "job", d, last); err != nil {
					return
				}
			case r.Context().Err() != nil:
				return
			case errors.Is(err, jobs.ErrNotFound):
				if _, err := io.WriteString(out, "event: gone\ndata: {}\n\n"); err == nil {
					_ = out.flush()
				}
				return
			default:
				// A failed read is not an end (Postgres away for a moment): the next wake-up
				// reads again, at the latest the next keep-alive.
				h.cfg.Logger.Warn("console: the job page's read failed", "job", id, "error", err)
			}
		}
		select {
		case <-r.Context().Done():
			return
		case <-h.closing:
			return
		case v := <-notify:
			read = v == 0 || v > known
		case <-keep.C:
			read = true
			if _, err := io.WriteString(out, ": keep-alive\n\n"); err != nil || out.flush() != nil {
				return
			}
			ctx, cancel := h.readCtx(r.Context())
			_ = h.cfg.Jobs.Watch(ctx, id, watchTTL)
			cancel()
		}
	}
}

// jobCancel cancels a job that has not ended, or a dead one (see jobs.Store.Cancel), as DELETE
// /v1/jobs/{id} does for its tenant: the
// transition in Postgres (after it no result can be stored), then the abort of its task wherever
// it runs. A job already canceled answers 200 with "changed": false (nothing counted, nothing
// audited; its task aborted again, as the first cancel's abort may not have run), as the API
// answers a cancel sent again; another end is 409 job_terminal, naming its
// status.
func (h *Handler) jobCancel(w http.ResponseWriter, r *http.Request, s *operator.Session) {
	id := r.PathValue("id")
	job, err := h.cfg.Jobs.Cancel(r.Context(), id)
	var te *jobs.TerminalError
	if jobs.AlreadyCanceled(err) && errors.As(err, &te) {
		// Its task is aborted again (neither counted nor audited): the first cancel's abort may
		// not have run (Redis refused it, or its answer was lost with the commit's).
		h.abortCanceled(r, te.Job)
		writeJSON(w, http.StatusOK, map[string]any{"message": "job " + id + " was already canceled", "changed": false})
		return
	}
	if errors.As(err, &te) {
		err = &apiError{status: http.StatusConflict, typ: "job_terminal", message: "the job already ended: it is " + string(te.Status)}
	}
	if err != nil {
		writeError(w, r, h.cfg.Logger, err)
		return
	}
	h.abortCanceled(r, job)
	if h.cfg.Canceled != nil {
		h.cfg.Canceled(job.Credential)
	}
	h.audit(r, s.Operator, audit.Entry{Action: "job.cancel", Target: job.ID, Count: 1})
	writeJSON(w, http.StatusOK, map[string]any{"message": "job " + job.ID + " canceled", "changed": true})
}

// abortCanceled aborts the task of canceled job (dispatch.Tasks.AbortEnded), when the console
// has Tasks. The job is canceled whatever Redis says: the worker skips terminal jobs, and an
// attempt already in flight stops, unstored, at its lease's next renewal (within 5 s). Nor does
// the answer wait for a stalled Redis past dispatch.RedisWait; a failure is logged.
func (h *Handler) abortCanceled(r *http.Request, job *jobs.Job) {
	if h.cfg.Tasks == nil || job == nil {
		return
	}
	if err := h.cfg.AfterCommit.Run(func() error { return h.cfg.Tasks.AbortEnded(job) }); err != nil {
		h.cfg.Logger.WarnContext(r.Context(), "console: abort canceled job's task", "job_id", job.ID, "error", err)
	}
}
