package llmsim

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// BatchConfig configures the simulated batch APIs (Anthropic Message Batches, OpenAI Batch).
// Outcomes follow the clock of [Config.Now], so tests move a fake clock instead of waiting.
type BatchConfig struct {
	// ProcessingDelay is how long after its creation a batch ends (all its requests answered
	// at once). Default 0: a batch has ended by the first poll.
	ProcessingDelay time.Duration
	// Window is the provider's batch window: a batch whose ProcessingDelay exceeds it ends at
	// creation + Window with every request expired. Default 24h.
	Window time.Duration
	// ExpireMarker, when a request body contains it, makes that request expire (the others of
	// its batch end normally). Default "llmsim-batch-expire".
	ExpireMarker string
	// OverloadMarker, when a request body contains it, makes that request end errored with the
	// provider's overload error (Anthropic overloaded_error; OpenAI a 503 response).
	// Default "llmsim-batch-overloaded".
	OverloadMarker string
	// RateLimitMarker, when a request body contains it, makes that request end errored with the
	// provider's rate-limit error (Anthropic 429 rate_limit_error; OpenAI a 429 response of type
	// requests, code rate_limit_exceeded). Default "llmsim-batch-rate-limited".
	RateLimitMarker string
	// ServerErrorMarker, when a request body contains it, makes that request end errored with
	// the provider's server error (Anthropic 500 api_error; OpenAI a 500 response): a failure
	// of the provider's side that is not its capacity, so the round counts an attempt.
	// Default "llmsim-batch-server-error".
	ServerErrorMarker string
	// BillingMarker, when a request body contains it, makes that request end errored with the
	// provider's answer to an account that cannot pay (Anthropic 402 billing_error; OpenAI a
	// 429 response of code insufficient_quota). Default "llmsim-batch-billing".
	BillingMarker string
	// DeleteErrorMarker, when an OpenAI file's content contains it (a batch input file whose
	// request holds it), makes every DELETE /v1/files/{id} of the file fail with a 500
	// server_error, the file kept: a provider that cannot delete it. Default
	// "llmsim-batch-delete-error".
	DeleteErrorMarker string
	// EnqueuedTokenLimit, when set, caps the input tokens of the OpenAI batches not yet ended,
	// as OpenAI's enqueued token limit does: a batch created past it fails at once, with error
	// code token_limit_exceeded, no request run and no file. Default 0: no cap.
	EnqueuedTokenLimit int
	// MaxBytes is the largest batch accepted, as the providers cap it: an Anthropic create body
	// (larger: 413 request_too_large) or an OpenAI batch input file (larger: 400 at its upload).
	// Default 256 MB (Anthropic's; OpenAI's file is capped at 200 MB, which this does not
	// tell apart).
	MaxBytes int64
}

// DefaultBatchMaxBytes is [BatchConfig.MaxBytes]'s default: Anthropic's 256 MB.
const DefaultBatchMaxBytes = 256 << 20

// Price is the simulator's price table in US dollars per million tokens, for benchmarks to
// report cost. Batch requests cost BatchDiscount of it, as the providers charge.
var Price = struct{ InputPerMTok, OutputPerMTok, BatchDiscount float64 }{3, 15, 0.5}

// Cost is what input and output tokens cost at [Price]: online, or in a batch.
func Cost(input, output int, batch bool) float64 {
	c := (float64(input)*Price.InputPerMTok + float64(output)*Price.OutputPerMTok) / 1e6
	if batch {
		c *= Price.BatchDiscount
	}
	return c
}

// BatchStats counts the batch endpoints' work since start (Reset does not clear it).
type BatchStats struct {
	// Created is the number of batches created; Requests the requests in them.
	Created  int `json:"created"`
	Requests int `json:"requests"`
	// Polls counts batch reads (retrieve and list); Results counts result or output/error file
	// downloads; Uploads counts file uploads; Deletes counts files deleted; Cancels counts
	// cancel calls.
	Polls   int `json:"polls"`
	Results int `json:"results"`
	Uploads int `json:"uploads"`
	Deletes int `json:"deletes"`
	Cancels int `json:"cancels"`
	// Succeeded counts requests answered; InputTokens and OutputTokens are their usage.
	Succeeded    int `json:"succeeded"`
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
}

func (c BatchConfig) withDefaults() BatchConfig {
	if c.Window == 0 {
		c.Window = 24 * time.Hour
	}
	if c.ExpireMarker == "" {
		c.ExpireMarker = "llmsim-batch-expire"
	}
	if c.OverloadMarker == "" {
		c.OverloadMarker = "llmsim-batch-overloaded"
	}
	if c.RateLimitMarker == "" {
		c.RateLimitMarker = "llmsim-batch-rate-limited"
	}
	if c.ServerErrorMarker == "" {
		c.ServerErrorMarker = "llmsim-batch-server-error"
	}
	if c.BillingMarker == "" {
		c.BillingMarker = "llmsim-batch-billing"
	}
	if c.DeleteErrorMarker == "" {
		c.DeleteErrorMarker = "llmsim-batch-delete-error"
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultBatchMaxBytes
	}
	return c
}

func (c BatchConfig) validate() error {
	switch {
	case c.ProcessingDelay < 0:
		return errors.New("batch.processing_delay: must not be negative")
	case c.Window < 0:
		return errors.New("batch.window: must not be negative")
	case c.EnqueuedTokenLimit < 0:
		return errors.New("batch.enqueued_token_limit: must not be negative")
	case c.MaxBytes < 0:
		return errors.New("batch.max_bytes: must not be negative")
	}
	return nil
}

// simRequest is one request of a batch: its custom_id and provider-native body.
type simRequest struct {
	customID string
	body     []byte
}

// simResult is one request's outcome.
type simResult struct {
	customID string
	kind     string // succeeded, errored, expired, canceled
	status   int    // errored: the HTTP status of the error
	body     []byte // succeeded: the message; errored: the provider's error body
}

// simBatch is one batch of either provider.
type simBatch struct {
	id        string
	provider  provider
	created   time.Time
	requests  []simRequest
	metadata  map[string]string
	inputFile string // OpenAI
	// canceledAt is set by a cancel before the batch ended; endedAt and results once ended.
	canceledAt *time.Time
	endedAt    *time.Time
	results    []simResult
	outputFile string // OpenAI: the file of succeeded lines (and errors with a response)
	errorFile  string // OpenAI: the file of the other lines
	// failed (OpenAI), when set, is why the batch failed at its creation (ended then, without
	// results): its error's code and message.
	failed *[2]string
}

// batchStore holds the batches and files of both providers.
type batchStore struct {
	mu      sync.Mutex
	batches map[string]*simBatch
	order   []string // batch ids in creation order, for lists
	files   map[string][]byte
	// fileInfo is what the OpenAI files list tells of each file in files; fileOrder their ids
	// in creation order (deleted ones included: a list passes over them).
	fileInfo  map[string]simFile
	fileOrder []string
	stats     BatchStats
}

// simFile is an OpenAI file's metadata, as its list answers it.
type simFile struct {
	filename, purpose string
	createdAt         int64
}

func newBatchStore() *batchStore {
	return &batchStore{batches: map[string]*simBatch{}, files: map[string][]byte{}, fileInfo: map[string]simFile{}}
}

// putFileLocked stores an OpenAI file. The caller holds st.mu.
func (st *batchStore) putFileLocked(id string, data []byte, f simFile) {
	st.files[id] = data
	st.fileInfo[id] = f
	st.fileOrder = append(st.fileOrder, id)
}

// BatchStats returns the batch endpoints' counters.
func (s *Server) BatchStats() BatchStats {
	s.batches.mu.Lock()
	defer s.batches.mu.Unlock()
	return s.batches.stats
}

// batchRoutes registers both providers' batch endpoints.
func (s *Server) batchRoutes(mux *http.ServeMux) {
	aView := func(r *http.Request, b *simBatch) any { return s.anthropicView(r, b) }
	oView := func(_ *http.Request, b *simBatch) any { return s.openAIView(b) }
	polled := func(st *BatchStats) { st.Polls++ }
	canceled := func(st *BatchStats) { st.Cancels++ }
	mux.HandleFunc("POST /v1/messages/batches", s.anthropicCreate)
	mux.HandleFunc("GET /v1/messages/batches", s.anthropicList)
	mux.HandleFunc("GET /v1/messages/batches/{id}", s.serveBatch(anthropic{}, "message batch", polled, nil, aView))
	mux.HandleFunc("GET /v1/messages/batches/{id}/results", s.anthropicResults)
	mux.HandleFunc("POST /v1/messages/batches/{id}/cancel", s.serveBatch(anthropic{}, "message batch", canceled, s.cancelLocked, aView))
	mux.HandleFunc("POST /v1/files", s.openAIUpload)
	mux.HandleFunc("GET /v1/files", s.openAIFileList)
	mux.HandleFunc("GET /v1/files/{id}/content", s.openAIFileContent)
	mux.HandleFunc("DELETE /v1/files/{id}", s.openAIFileDelete)
	mux.HandleFunc("POST /v1/batches", s.openAICreate)
	mux.HandleFunc("GET /v1/batches", s.openAIList)
	mux.HandleFunc("GET /v1/batches/{id}", s.serveBatch(openAI{}, "batch", polled, nil, oView))
	mux.HandleFunc("POST /v1/batches/{id}/cancel", s.serveBatch(openAI{}, "batch", canceled, s.cancelLocked, oView))
}

// serveBatch answers with the batch named in the path as view renders it (404 in p's format
// when p has none), counting the call with count and letting act (nil: none) act on it first.
func (s *Server) serveBatch(p provider, what string, count func(*BatchStats), act func(*simBatch),
	view func(*http.Request, *simBatch) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.batches.mu.Lock()
		defer s.batches.mu.Unlock()
		count(&s.batches.stats)
		b := s.lookupLocked(p, r.PathValue("id"))
		if b == nil {
			notFound(w, p, what)
			return
		}
		if act != nil {
			act(b)
		}
		writeJSON(w, http.StatusOK, view(r, b))
	}
}

// cancelLocked cancels b unless it ended: its requests end canceled (none had been processed:
// a batch's requests are answered together at its end). The caller holds st.mu.
func (s *Server) cancelLocked(b *simBatch) {
	if b.endedAt == nil && b.canceledAt == nil {
		now := s.cfg.Now()
		b.canceledAt = &now
		s.settleLocked(b)
	}
}

// newID returns prefix and 24 random hex digits.
func newID(prefix string) string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// create stores a new batch; the caller holds no lock. An OpenAI batch past
// [BatchConfig.EnqueuedTokenLimit] is stored failed.
func (s *Server) createBatch(p provider, prefix string, reqs []simRequest, metadata map[string]string, inputFile string) *simBatch {
	b := &simBatch{id: newID(prefix), provider: p, created: s.cfg.Now(), requests: reqs, metadata: metadata, inputFile: inputFile}
	st := s.batches
	st.mu.Lock()
	defer st.mu.Unlock()
	if limit := s.cfg.Batch.EnqueuedTokenLimit; limit > 0 && p.name() == "openai" {
		enqueued := batchTokens(reqs)
		for _, o := range st.batches {
			if o.provider.name() == "openai" {
				if s.settleLocked(o); o.endedAt == nil {
					enqueued += batchTokens(o.requests)
				}
			}
		}
		if enqueued > limit {
			b.endedAt = &b.created
			b.failed = &[2]string{"token_limit_exceeded", fmt.Sprintf("Enqueued token limit reached in organization llmsim. "+
				"Limit: %d enqueued tokens. Please try again once some in_progress batches have been completed.", limit)}
		}
	}
	st.batches[b.id] = b
	st.order = append(st.order, b.id)
	st.stats.Created++
	st.stats.Requests += len(reqs)
	return b
}

// lookup returns batch id of provider p (ended if its time came), counting a poll; nil when
// there is none. The caller holds st.mu.
func (s *Server) lookupLocked(p provider, id string) *simBatch {
	b, ok := s.batches.batches[id]
	if !ok || b.provider.name() != p.name() {
		return nil
	}
	s.settleLocked(b)
	return b
}

// settleLocked ends b when its time has come: at creation + ProcessingDelay, or at the window
// with every request expired; a canceled batch ended at its cancel. The caller holds st.mu.
func (s *Server) settleLocked(b *simBatch) {
	if b.endedAt != nil {
		return
	}
	now := s.cfg.Now()
	cfg := s.cfg.Batch
	switch {
	case b.canceledAt != nil:
		b.finish(*b.canceledAt, func(r simRequest) simResult { return simResult{customID: r.customID, kind: "canceled"} })
	case cfg.ProcessingDelay > cfg.Window && !now.Before(b.created.Add(cfg.Window)):
		b.finish(b.created.Add(cfg.Window), func(r simRequest) simResult { return simResult{customID: r.customID, kind: "expired"} })
	case cfg.ProcessingDelay <= cfg.Window && !now.Before(b.created.Add(cfg.ProcessingDelay)):
		b.finish(b.created.Add(cfg.ProcessingDelay), func(r simRequest) simResult { return s.answerBatchRequest(b.provider, r) })
	default:
		return
	}
	for _, r := range b.results {
		if r.kind == "succeeded" {
			s.batches.stats.Succeeded++
		}
	}
	if b.provider.name() == "openai" {
		s.writeOpenAIFilesLocked(b)
	}
}

// batchTokens is the input tokens of reqs, as the online endpoint counts them (0 for a body it
// cannot read).
func batchTokens(reqs []simRequest) int {
	n := 0
	for _, r := range reqs {
		if req, err := parseChatRequest(r.body); err == nil {
			n += req.inputTokens()
		}
	}
	return n
}

// finish ends b at t with one result per request, in request order.
func (b *simBatch) finish(t time.Time, outcome func(simRequest) simResult) {
	b.endedAt = &t
	b.results = make([]simResult, len(b.requests))
	for i, r := range b.requests {
		b.results[i] = outcome(r)
	}
}

// answerBatchRequest decides one request's outcome as the online endpoint would answer it,
// without buckets or injected faults (batch requests are outside the online rate limits): the
// markers of [BatchConfig], the bad-request marker of [Faults], a body the endpoint refuses, a
// request over the model's context window (Config.ContextTokens).
func (s *Server) answerBatchRequest(p provider, r simRequest) simResult {
	cfg := s.cfg.Batch
	errored := func(status int, msg string) simResult {
		return simResult{customID: r.customID, kind: "errored", status: status,
			body: p.errorBody(apiError{status: status, message: msg}, newID("req_"))}
	}
	switch {
	case bytes.Contains(r.body, []byte(cfg.ExpireMarker)):
		return simResult{customID: r.customID, kind: "expired"}
	case bytes.Contains(r.body, []byte(cfg.OverloadMarker)):
		return errored(p.overloadStatus(), "")
	case bytes.Contains(r.body, []byte(cfg.RateLimitMarker)):
		return errored(http.StatusTooManyRequests, "")
	case bytes.Contains(r.body, []byte(cfg.ServerErrorMarker)):
		return errored(http.StatusInternalServerError, "")
	case bytes.Contains(r.body, []byte(cfg.BillingMarker)):
		e := apiError{status: http.StatusPaymentRequired, message: "Your credit balance is too low to access the Anthropic API."}
		if p.name() == "openai" {
			e = apiError{status: http.StatusTooManyRequests, kind: kindSpendCap}
		}
		return simResult{customID: r.customID, kind: "errored", status: e.status, body: p.errorBody(e, newID("req_"))}
	case bytes.Contains(r.body, []byte(cmp.Or(s.start.BadRequestMarker, DefaultBadRequestMarker))):
		return errored(http.StatusBadRequest, "request contains the llmsim bad-request marker")
	}
	req, err := parseChatRequest(r.body)
	if err != nil {
		return errored(http.StatusBadRequest, err.Error())
	}
	if e, over := s.overContext(p, req); over {
		return simResult{customID: r.customID, kind: "errored", status: e.status, body: p.errorBody(e, newID("req_"))}
	}
	text, maxedOut := replyText(req), false
	if n := s.cfg.ReplyTokens; n > 0 {
		if req.maxTokens > 0 && int64(n) > req.maxTokens {
			n, maxedOut = int(req.maxTokens), true
		}
		text = padReply(text, n)
	}
	sum := sha256.Sum256(r.body)
	rep := reply{id: p.idPrefix() + hex.EncodeToString(sum[:12]), model: req.model, text: text,
		inputTokens: req.inputTokens(), outputTokens: tokens(len(text)), maxedOut: maxedOut, created: s.cfg.Now()}
	s.batches.stats.InputTokens += rep.inputTokens
	s.batches.stats.OutputTokens += rep.outputTokens
	return simResult{customID: r.customID, kind: "succeeded", status: http.StatusOK, body: p.successBody(rep)}
}

// listLocked returns p's batches, newest first. The caller holds st.mu.
func (s *Server) listLocked(p provider) []*simBatch {
	var out []*simBatch
	for i := len(s.batches.order) - 1; i >= 0; i-- {
		b := s.batches.batches[s.batches.order[i]]
		if b.provider.name() == p.name() {
			s.settleLocked(b)
			out = append(out, b)
		}
	}
	return out
}

// counts tallies a batch's results by kind (all processing while it runs).
func (b *simBatch) counts() map[string]int {
	c := map[string]int{}
	if b.endedAt == nil {
		c["processing"] = len(b.requests)
		return c
	}
	for _, r := range b.results {
		c[r.kind]++
	}
	return c
}

// notFound answers 404 in p's error format.
func notFound(w http.ResponseWriter, p provider, what string) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(http.StatusNotFound)
	_, _ = w.Write(p.errorBody(apiError{status: http.StatusNotFound, message: what + " not found"}, newID("req_")))
}

// badRequest answers 400 in p's error format.
func badRequest(w http.ResponseWriter, p provider, format string, args ...any) {
	w.Header().Set("content-type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(p.errorBody(apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...)}, newID("req_")))
}
