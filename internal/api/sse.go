package api

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// events serves GET /v1/jobs/{id}/events: one Server-Sent Event per transition, read from the
// job_events table. Event name = the new status, id = the per-job sequence number, data = the job
// JSON (its state when the event is sent, with "status" set to the event's status; the terminal
// event therefore carries the result or the error). The stream closes after the event that leaves
// the job terminal; a reconnect after it (Last-Event-ID at or past the terminal event) is answered
// 204 No Content, which ends an EventSource for good.
//
// Where it starts: after Last-Event-ID when the client sends one (so a reconnect gets exactly the
// events it missed; "0" replays the whole history), else at the job's latest event (its current
// state, which for a finished job is its terminal event, sent at once).
//
// How it follows: it subscribes to the process's Listener (Postgres LISTEN/NOTIFY, so transitions
// made by any worker or replica arrive) and watches the job (Store.Watch: only watched jobs'
// transitions are announced; it returns once every transition is either committed or sure to be
// announced) before its first read, and on each signal re-reads the events after the last one
// sent, so no transition is lost between a read and a notification and none is sent twice. A keep-alive comment every KeepAlive also re-reads, in case a notification
// was lost. When the client goes away the handler returns and unsubscribes: nothing outlives it.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	// The caller first: who may not see the job learns nothing from the header's validation.
	job, signed, err := s.streamJob(r)
	if signed {
		// A signed URL carries its own authorization, and no cookie is involved: a page of any
		// origin may follow the job it was handed the URL of.
		w.Header().Set("Access-Control-Allow-Origin", "*")
	}
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	last, resume, err := lastEventID(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	if resume && job.Status.Terminal() && last >= job.EventSeq {
		// The client has the terminal event: nothing will ever follow. 204 is what makes an
		// EventSource stop reconnecting (a 200 with an empty stream makes it come back forever).
		w.WriteHeader(http.StatusNoContent)
		return
	}
	release, err := s.streams.open(job.Tenant)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	defer release()
	var notify <-chan int
	if s.cfg.Listener != nil {
		ch, unsubscribe := s.cfg.Listener.Subscribe(job.ID)
		defer unsubscribe()
		notify = ch
	}
	// Postgres announces only watched jobs' transitions (NOTIFY serializes commits); watch
	// before the first read, and renew at every keep-alive.
	watchTTL := 4 * s.cfg.KeepAlive
	if err := s.cfg.Store.Watch(r.Context(), job.ID, watchTTL); err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	if !resume {
		// Read the job again now that we are subscribed: any transition after this read is
		// signalled, so starting at its latest event loses nothing.
		if job, err = s.cfg.Store.Get(r.Context(), job.ID); err != nil {
			writeError(w, r, s.cfg.Logger, err)
			return
		}
		last = job.EventSeq - 1
	}

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// The server's read timeout would end a stream that outlives it; the client sends nothing
	// more. Writes get a deadline each instead of the server's one for the whole answer.
	_ = rc.SetReadDeadline(time.Time{})
	out := &deadlineWriter{w: w, rc: rc, timeout: s.cfg.EventWriteTimeout}
	ticker := time.NewTicker(s.cfg.KeepAlive)
	defer ticker.Stop()
	for {
		done, err := s.sendEvents(out, r, job.ID, &last)
		if err != nil {
			// Headers are sent: the stream just ends, and the client resumes with Last-Event-ID.
			if r.Context().Err() == nil {
				s.cfg.Logger.WarnContext(r.Context(), "event stream ended on an error", "job_id", job.ID, "error", err)
			}
			return
		}
		if done {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		case <-notify:
		case <-ticker.C:
			if _, err := io.WriteString(out, ": keep-alive\n\n"); err != nil {
				return
			}
			if err := s.cfg.Store.Watch(r.Context(), job.ID, watchTTL); err != nil && r.Context().Err() == nil {
				s.cfg.Logger.WarnContext(r.Context(), "renew event watch", "job_id", job.ID, "error", err)
			}
		}
	}
}

// lastEventID parses the Last-Event-ID header: resume is false without it.
func lastEventID(r *http.Request) (last int, resume bool, err error) {
	v := strings.TrimSpace(r.Header.Get("Last-Event-ID"))
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, false, &httpError{status: http.StatusBadRequest, typ: "invalid_last_event_id", message: fmt.Sprintf("Last-Event-ID %q must be a non-negative event sequence number", v)}
	}
	return n, true, nil
}

// sendEvents writes the job's events after *last and advances *last. done is true when the job
// is terminal and its latest event has been sent: the stream is complete.
func (s *Server) sendEvents(w io.Writer, r *http.Request, id string, last *int) (done bool, err error) {
	evs, err := s.cfg.Store.Events(r.Context(), id, *last)
	if err != nil {
		return false, err
	}
	// Read after the events, so the job is at least as new as the last of them.
	job, err := s.cfg.Store.Get(r.Context(), id)
	if err != nil {
		return false, err
	}
	for _, ev := range evs {
		snapshot := *job
		snapshot.Status = ev.Type
		data, err := json.Marshal(&snapshot)
		if err != nil {
			return false, fmt.Errorf("encode job: %w", err)
		}
		if _, err := fmt.Fprintf(w, "event: %s\nid: %d\ndata: %s\n\n", ev.Type, ev.Seq, data); err != nil {
			return false, err
		}
		*last = ev.Seq
	}
	return job.Status.Terminal() && *last >= job.EventSeq, nil
}
