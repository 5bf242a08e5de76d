package llmsim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// anthropicBatch is the Message Batch object.
type anthropicBatch struct {
	ID                string         `json:"id"`
	Type              string         `json:"type"`
	ProcessingStatus  string         `json:"processing_status"`
	RequestCounts     map[string]int `json:"request_counts"`
	EndedAt           *string        `json:"ended_at"`
	CreatedAt         string         `json:"created_at"`
	ExpiresAt         string         `json:"expires_at"`
	ArchivedAt        *string        `json:"archived_at"`
	CancelInitiatedAt *string        `json:"cancel_initiated_at"`
	ResultsURL        *string        `json:"results_url"`
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func rfc3339Ptr(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := rfc3339(*t)
	return &s
}

// anthropicView renders b; the caller holds st.mu and settled b.
func (s *Server) anthropicView(r *http.Request, b *simBatch) anthropicBatch {
	c := b.counts()
	counts := map[string]int{"processing": c["processing"], "succeeded": c["succeeded"], "errored": c["errored"],
		"canceled": c["canceled"], "expired": c["expired"]}
	v := anthropicBatch{ID: b.id, Type: "message_batch", ProcessingStatus: "in_progress", RequestCounts: counts,
		CreatedAt: rfc3339(b.created), ExpiresAt: rfc3339(b.created.Add(s.cfg.Batch.Window)),
		CancelInitiatedAt: rfc3339Ptr(b.canceledAt), EndedAt: rfc3339Ptr(b.endedAt)}
	if b.endedAt != nil {
		v.ProcessingStatus = "ended"
		u := "http://" + r.Host + "/v1/messages/batches/" + b.id + "/results"
		v.ResultsURL = &u
	}
	return v
}

// anthropicCreate is POST /v1/messages/batches: {"requests": [{"custom_id", "params"}]}.
func (s *Server) anthropicCreate(w http.ResponseWriter, r *http.Request) {
	p := anthropic{}
	var body struct {
		Requests []struct {
			CustomID string          `json:"custom_id"`
			Params   json.RawMessage `json:"params"`
		} `json:"requests"`
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, s.cfg.Batch.MaxBytes+1))
	if err == nil && int64(len(raw)) > s.cfg.Batch.MaxBytes {
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusRequestEntityTooLarge)
		_, _ = w.Write(p.errorBody(apiError{status: http.StatusRequestEntityTooLarge,
			message: fmt.Sprintf("Request exceeds the maximum allowed number of bytes (%d).", s.cfg.Batch.MaxBytes)}, newID("req_")))
		return
	}
	if err == nil {
		err = unmarshalExact(raw, &body)
	}
	if err != nil || len(body.Requests) == 0 {
		badRequest(w, p, "requests: a non-empty list of {custom_id, params} is required")
		return
	}
	seen := map[string]bool{}
	reqs := make([]simRequest, 0, len(body.Requests))
	for i, q := range body.Requests {
		if q.CustomID == "" || len(q.CustomID) > 64 || seen[q.CustomID] {
			badRequest(w, p, "requests.%d.custom_id: must be unique within the batch and 1-64 characters", i)
			return
		}
		seen[q.CustomID] = true
		reqs = append(reqs, simRequest{customID: q.CustomID, body: q.Params})
	}
	b := s.createBatch(p, "msgbatch_", reqs, nil, "")
	s.batches.mu.Lock()
	v := s.anthropicView(r, b)
	s.batches.mu.Unlock()
	writeJSON(w, http.StatusOK, v)
}

// anthropicList is GET /v1/messages/batches: newest first, a page of at most limit (1 to 1000,
// default 20) right after the batch whose id is after_id (older ones), or right before the one
// whose id is before_id (newer ones; neither: from the newest), with has_more (more in the
// direction asked), first_id and last_id as Anthropic answers them.
func (s *Server) anthropicList(w http.ResponseWriter, r *http.Request) {
	p := anthropic{}
	limit := 20
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			badRequest(w, p, "limit: must be an integer from 1 to 1000, not %q", v)
			return
		}
		limit = n
	}
	after, before := r.URL.Query().Get("after_id"), r.URL.Query().Get("before_id")
	if after != "" && before != "" {
		badRequest(w, p, "after_id and before_id cannot both be given")
		return
	}
	s.batches.mu.Lock()
	defer s.batches.mu.Unlock()
	s.batches.stats.Polls++
	all := s.listLocked(p)
	name, cursor := "after_id", after
	if before != "" {
		name, cursor = "before_id", before
	}
	if cursor != "" {
		i := slices.IndexFunc(all, func(b *simBatch) bool { return b.id == cursor })
		if i < 0 {
			badRequest(w, p, "%s: no such message batch %q", name, cursor)
			return
		}
		if after != "" {
			all = all[i+1:]
		} else {
			// The page nearest the cursor: the last limit of the newer batches.
			all = all[:i]
			slices.Reverse(all)
		}
	}
	hasMore := len(all) > limit
	all = all[:min(limit, len(all))]
	if before != "" {
		slices.Reverse(all) // newest first within the page
	}
	data := []anthropicBatch{}
	for _, b := range all {
		data = append(data, s.anthropicView(r, b))
	}
	page := struct {
		Data    []anthropicBatch `json:"data"`
		HasMore bool             `json:"has_more"`
		FirstID *string          `json:"first_id"`
		LastID  *string          `json:"last_id"`
	}{Data: data, HasMore: hasMore}
	if len(data) > 0 {
		page.FirstID, page.LastID = &data[0].ID, &data[len(data)-1].ID
	}
	writeJSON(w, http.StatusOK, page)
}

// anthropicResults is GET /v1/messages/batches/{id}/results: JSONL, one line per request.
func (s *Server) anthropicResults(w http.ResponseWriter, r *http.Request) {
	s.batches.mu.Lock()
	defer s.batches.mu.Unlock()
	s.batches.stats.Results++
	b := s.lookupLocked(anthropic{}, r.PathValue("id"))
	if b == nil {
		notFound(w, anthropic{}, "message batch")
		return
	}
	if b.endedAt == nil {
		badRequest(w, anthropic{}, "message batch %s has not ended: its results are not available yet", b.id)
		return
	}
	w.Header().Set("content-type", "application/binary")
	w.WriteHeader(http.StatusOK)
	for _, res := range b.results {
		result := map[string]any{"type": res.kind}
		switch res.kind {
		case "succeeded":
			result["message"] = json.RawMessage(res.body)
		case "errored":
			result["error"] = json.RawMessage(res.body)
		}
		line := mustJSON(map[string]any{"custom_id": res.customID, "result": result})
		_, _ = w.Write(append(line, '\n'))
	}
}
