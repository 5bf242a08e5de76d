package llmsim

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// openAIBatch is the Batch object.
type openAIBatch struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	Errors           any               `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        int64             `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    map[string]int    `json:"request_counts"`
	Metadata         map[string]string `json:"metadata"`
}

func unixPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	u := t.Unix()
	return &u
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// openAIView renders b; the caller holds st.mu and settled b.
func (s *Server) openAIView(b *simBatch) openAIBatch {
	c := b.counts()
	created := b.created.Unix()
	v := openAIBatch{ID: b.id, Object: "batch", Endpoint: "/v1/chat/completions", InputFileID: b.inputFile,
		CompletionWindow: "24h", Status: "in_progress", CreatedAt: created, InProgressAt: &created,
		ExpiresAt: b.created.Add(s.cfg.Batch.Window).Unix(), Metadata: b.metadata,
		CancellingAt: unixPtr(b.canceledAt), OutputFileID: strPtr(b.outputFile), ErrorFileID: strPtr(b.errorFile),
		RequestCounts: map[string]int{"total": len(b.requests), "completed": c["succeeded"], "failed": c["errored"]}}
	if b.metadata == nil {
		v.Metadata = map[string]string{}
	}
	switch {
	case b.endedAt == nil:
	case b.failed != nil:
		v.Status, v.FailedAt, v.InProgressAt = "failed", unixPtr(b.endedAt), nil
		v.Errors = map[string]any{"object": "list", "data": []any{map[string]any{
			"code": b.failed[0], "message": b.failed[1], "param": nil, "line": nil}}}
	case b.canceledAt != nil:
		v.Status, v.CancelledAt = "cancelled", unixPtr(b.endedAt)
	case c["expired"] == len(b.requests):
		v.Status, v.ExpiredAt = "expired", unixPtr(b.endedAt)
	default:
		v.Status, v.FinalizingAt, v.CompletedAt = "completed", unixPtr(b.endedAt), unixPtr(b.endedAt)
	}
	return v
}

// writeOpenAIFilesLocked stores an ended batch's output file (the requests with a response) and
// error file (the rest), as OpenAI does. The caller holds st.mu.
func (s *Server) writeOpenAIFilesLocked(b *simBatch) {
	var out, errs bytes.Buffer
	for _, r := range b.results {
		line := map[string]any{"id": newID("batch_req_"), "custom_id": r.customID, "response": nil, "error": nil}
		dst := &errs
		switch r.kind {
		case "succeeded", "errored":
			line["response"] = map[string]any{"status_code": r.status, "request_id": newID("req_"), "body": json.RawMessage(r.body)}
			if r.kind == "succeeded" {
				dst = &out
			}
		case "expired":
			line["error"] = map[string]string{"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}
		case "canceled":
			line["error"] = map[string]string{"code": "batch_cancelled", "message": "This request was not executed because the batch was cancelled."}
		}
		dst.Write(mustJSON(line))
		dst.WriteByte('\n')
	}
	if out.Len() > 0 {
		b.outputFile = newID("file-")
		s.batches.putFileLocked(b.outputFile, out.Bytes(), simFile{filename: b.id + "_output.jsonl", purpose: "batch_output",
			createdAt: s.cfg.Now().Unix()})
	}
	if errs.Len() > 0 {
		b.errorFile = newID("file-")
		s.batches.putFileLocked(b.errorFile, errs.Bytes(), simFile{filename: b.id + "_error.jsonl", purpose: "batch_output",
			createdAt: s.cfg.Now().Unix()})
	}
}

// openAIUpload is POST /v1/files (multipart: purpose=batch, file).
func (s *Server) openAIUpload(w http.ResponseWriter, r *http.Request) {
	p := openAI{}
	if err := r.ParseMultipartForm(64 << 20); err != nil {
		badRequest(w, p, "a multipart body with purpose and file is required: %v", err)
		return
	}
	f, hdr, err := r.FormFile("file")
	if err != nil || r.FormValue("purpose") != "batch" {
		badRequest(w, p, "purpose must be \"batch\" and file is required")
		return
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		badRequest(w, p, "read file: %v", err)
		return
	}
	if int64(len(data)) > s.cfg.Batch.MaxBytes {
		badRequest(w, p, "File is too large: %d bytes, at most %d for purpose batch.", len(data), s.cfg.Batch.MaxBytes)
		return
	}
	id := newID("file-")
	meta := simFile{filename: hdr.Filename, purpose: "batch", createdAt: s.cfg.Now().Unix()}
	s.batches.mu.Lock()
	s.batches.putFileLocked(id, data, meta)
	s.batches.stats.Uploads++
	s.batches.mu.Unlock()
	writeJSON(w, http.StatusOK, openAIFileView(id, len(data), meta))
}

// openAIFileView is a file as OpenAI answers it.
func openAIFileView(id string, n int, f simFile) map[string]any {
	return map[string]any{"id": id, "object": "file", "bytes": n, "created_at": f.createdAt, "filename": f.filename,
		"purpose": f.purpose, "status": "processed"}
}

// openAIFileList is GET /v1/files: the files of purpose (all when not given), newest first (order
// desc, the default) or oldest first (asc), a page of at most limit (1 to 10,000, default
// 10,000) after the file whose id is after, with has_more, first_id and last_id, as OpenAI
// answers them.
func (s *Server) openAIFileList(w http.ResponseWriter, r *http.Request) {
	p := openAI{}
	q := r.URL.Query()
	limit := 10000
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			badRequest(w, p, "limit must be an integer from 1 to 10000, not %q", v)
			return
		}
		limit = n
	}
	order := cmp.Or(q.Get("order"), "desc")
	if order != "asc" && order != "desc" {
		badRequest(w, p, "order must be asc or desc, not %q", order)
		return
	}
	purpose, after := q.Get("purpose"), q.Get("after")
	s.batches.mu.Lock()
	defer s.batches.mu.Unlock()
	// Deleted files leave the order here, not at their delete (which would search it).
	s.batches.fileOrder = slices.DeleteFunc(s.batches.fileOrder, func(id string) bool {
		_, ok := s.batches.files[id]
		return !ok
	})
	var ids []string
	for _, id := range s.batches.fileOrder {
		if purpose == "" || s.batches.fileInfo[id].purpose == purpose {
			ids = append(ids, id)
		}
	}
	if order == "desc" {
		slices.Reverse(ids)
	}
	if after != "" {
		i := slices.Index(ids, after)
		if i < 0 {
			badRequest(w, p, "after: no such file %q", after)
			return
		}
		ids = ids[i+1:]
	}
	data := []map[string]any{}
	for _, id := range ids[:min(limit, len(ids))] {
		data = append(data, openAIFileView(id, len(s.batches.files[id]), s.batches.fileInfo[id]))
	}
	page := map[string]any{"object": "list", "data": data, "has_more": len(ids) > limit, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		page["first_id"], page["last_id"] = data[0]["id"], data[len(data)-1]["id"]
	}
	writeJSON(w, http.StatusOK, page)
}

// openAIFileContent is GET /v1/files/{id}/content.
func (s *Server) openAIFileContent(w http.ResponseWriter, r *http.Request) {
	s.batches.mu.Lock()
	data, ok := s.batches.files[r.PathValue("id")]
	s.batches.stats.Results++
	s.batches.mu.Unlock()
	if !ok {
		notFound(w, openAI{}, "file")
		return
	}
	w.Header().Set("content-type", "application/octet-stream")
	_, _ = w.Write(data)
}

// openAICreate is POST /v1/batches: {"input_file_id", "endpoint", "completion_window", "metadata"}.
func (s *Server) openAICreate(w http.ResponseWriter, r *http.Request) {
	p := openAI{}
	var body struct {
		InputFileID      string            `json:"input_file_id"`
		Endpoint         string            `json:"endpoint"`
		CompletionWindow string            `json:"completion_window"`
		Metadata         map[string]string `json:"metadata"`
	}
	raw, err := io.ReadAll(r.Body)
	if err == nil {
		err = unmarshalExact(raw, &body)
	}
	if err != nil {
		badRequest(w, p, "body is not valid JSON: %v", err)
		return
	}
	if body.Endpoint != "/v1/chat/completions" || body.CompletionWindow != "24h" {
		badRequest(w, p, "endpoint must be /v1/chat/completions and completion_window 24h")
		return
	}
	s.batches.mu.Lock()
	data, ok := s.batches.files[body.InputFileID]
	s.batches.mu.Unlock()
	if !ok {
		badRequest(w, p, "input_file_id %q: no such file", body.InputFileID)
		return
	}
	var reqs []simRequest
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		var line struct {
			CustomID string          `json:"custom_id"`
			Method   string          `json:"method"`
			URL      string          `json:"url"`
			Body     json.RawMessage `json:"body"`
		}
		if err := unmarshalExact(sc.Bytes(), &line); err != nil || line.CustomID == "" || seen[line.CustomID] ||
			line.Method != "POST" || line.URL != body.Endpoint {
			badRequest(w, p, "input file line %d: a unique custom_id, method POST and url %s are required", n, body.Endpoint)
			return
		}
		seen[line.CustomID] = true
		reqs = append(reqs, simRequest{customID: line.CustomID, body: line.Body})
	}
	if len(reqs) == 0 {
		badRequest(w, p, "input file has no requests")
		return
	}
	b := s.createBatch(p, "batch_", reqs, body.Metadata, body.InputFileID)
	s.batches.mu.Lock()
	v := s.openAIView(b)
	s.batches.mu.Unlock()
	writeJSON(w, http.StatusOK, v)
}

// openAIList is GET /v1/batches: newest first, a page of at most limit (1 to 100, default 20)
// after the batch whose id is after (none: from the newest), with has_more, first_id and
// last_id as OpenAI answers them; a client pages on with after set to the last id.
func (s *Server) openAIList(w http.ResponseWriter, r *http.Request) {
	p := openAI{}
	limit := 20
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			badRequest(w, p, "limit must be an integer from 1 to 100, not %q", v)
			return
		}
		limit = n
	}
	after := r.URL.Query().Get("after")
	s.batches.mu.Lock()
	defer s.batches.mu.Unlock()
	s.batches.stats.Polls++
	all := s.listLocked(p)
	if after != "" {
		i := slices.IndexFunc(all, func(b *simBatch) bool { return b.id == after })
		if i < 0 {
			badRequest(w, p, "after: no such batch %q", after)
			return
		}
		all = all[i+1:]
	}
	data := []openAIBatch{}
	for _, b := range all[:min(limit, len(all))] {
		data = append(data, s.openAIView(b))
	}
	page := map[string]any{"object": "list", "data": data, "has_more": len(all) > limit, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		page["first_id"], page["last_id"] = data[0].ID, data[len(data)-1].ID
	}
	writeJSON(w, http.StatusOK, page)
}

// openAIFileDelete is DELETE /v1/files/{id}: a 500 for a file holding
// BatchConfig.DeleteErrorMarker (kept).
func (s *Server) openAIFileDelete(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.batches.mu.Lock()
	data, ok := s.batches.files[id]
	refused := ok && bytes.Contains(data, []byte(s.cfg.Batch.DeleteErrorMarker))
	if ok && !refused {
		delete(s.batches.files, id)
		delete(s.batches.fileInfo, id)
		s.batches.stats.Deletes++
	}
	s.batches.mu.Unlock()
	if !ok {
		notFound(w, openAI{}, "file")
		return
	}
	if refused {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": map[string]any{
			"message": "The server had an error while deleting the file.", "type": "server_error", "param": nil, "code": nil}})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "file", "deleted": true})
}
