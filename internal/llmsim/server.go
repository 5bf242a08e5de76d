package llmsim

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// maxBodyBytes bounds a provider request body (Anthropic's limit is 32 MB).
const maxBodyBytes = 32 << 20

// maxControlBodyBytes bounds a /_sim/faults body.
const maxControlBodyBytes = 1 << 20

// Server is the simulator. It implements http.Handler and is safe for
// concurrent use by any number of goroutines.
type Server struct {
	cfg      Config
	limited  bool
	params   bucketParams
	mux      *http.ServeMux
	inFlight atomic.Int64
	seq      atomic.Uint64

	mu      sync.Mutex // guards the fields below and calls to cfg.Rand
	start   Faults     // as configured, restored by Reset
	faults  Faults     // resolved: defaults filled, OverloadedFor applied
	buckets map[string]*bucket
	stats   Stats
}

// New returns a simulator for cfg. It panics if cfg is invalid (see
// [Config.Validate]); callers taking configuration from users validate first.
func New(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic("llmsim: invalid config: " + err.Error())
	}
	cfg = cfg.withDefaults()
	s := &Server{
		cfg:     cfg,
		limited: cfg.Capacity > 0,
		start:   cfg.Faults,
		faults:  cfg.Faults.resolve(cfg.Now()),
		buckets: map[string]*bucket{},
		stats:   newStats(),
	}
	if s.limited {
		s.params = newBucketParams(cfg.Capacity, cfg.RefillPerSecond)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", s.serveChat(anthropic{}))
	mux.HandleFunc("POST /v1/chat/completions", s.serveChat(openAI{}))
	mux.HandleFunc("GET /_sim/stats", s.serveStats)
	mux.HandleFunc("POST /_sim/reset", s.serveReset)
	mux.HandleFunc("GET /_sim/faults", s.serveGetFaults)
	mux.HandleFunc("POST /_sim/faults", s.servePostFaults)
	s.mux = mux
	return s
}

// ServeHTTP serves the provider and control endpoints.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// SetFaults replaces every fault. OverloadedFor is applied from now. It
// returns an error naming the first invalid field and then changes nothing.
func (s *Server) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("set faults: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = f.resolve(s.cfg.Now())
	return nil
}

// Faults returns the current faults, with defaults filled in, OverloadedFor
// turned into OverloadedUntil and FailNext counted down so far.
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// Stats returns a copy of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	st := s.stats.clone()
	s.mu.Unlock()
	st.InFlight = int(s.inFlight.Load())
	return st
}

// Reset zeroes the counters, refills every bucket and restores the faults
// given in Config (re-applying OverloadedFor from now). Requests in flight
// finish normally and are counted after the reset.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats = newStats()
	s.buckets = map[string]*bucket{}
	s.faults = s.start.resolve(s.cfg.Now())
}

// answer is a decided response.
type answer struct {
	status int
	keyID  string
	header http.Header
	body   []byte
	slow   time.Duration
}

func (s *Server) serveChat(p provider) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.inFlight.Add(1)
		defer s.inFlight.Add(-1)
		started := time.Now()
		requestID := fmt.Sprintf("req_llmsim_%016d", s.seq.Add(1))
		a := s.decide(w, r, p, requestID)
		s.mu.Lock()
		s.stats.record(a.keyID, a.status)
		s.mu.Unlock()
		s.cfg.Logger.LogAttrs(r.Context(), slog.LevelDebug, "llmsim answer",
			slog.String("provider", p.name()),
			slog.String("key_id", a.keyID),
			slog.Int("status", a.status),
			slog.String("request_id", requestID),
			slog.Duration("duration", time.Since(started)))
		if a.status == StatusClientClosed {
			// The request context ended: the client left, or the server is
			// shutting down. Drop the connection rather than let net/http
			// send an empty 200.
			panic(http.ErrAbortHandler)
		}
		writeAnswer(r.Context(), w, a)
	}
}

// decide runs the checks in the order documented in the package comment.
func (s *Server) decide(w http.ResponseWriter, r *http.Request, p provider, requestID string) answer {
	ctx := r.Context()
	h := http.Header{}
	now := s.cfg.Now()

	s.mu.Lock()
	f := s.faults
	s.mu.Unlock()

	key := p.apiKey(r)
	if key == "" {
		p.setHeaders(h, requestID, nil, now)
		a := errorAnswer(p, h, requestID, "", apiError{status: http.StatusUnauthorized, kind: kindAuth})
		a.slow = f.SlowFirstByte
		return a
	}
	keyID := KeyID(key)
	closed := answer{status: StatusClientClosed, keyID: keyID}

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			p.setHeaders(h, requestID, nil, now)
			a := errorAnswer(p, h, requestID, keyID, apiError{status: http.StatusRequestEntityTooLarge})
			a.slow = f.SlowFirstByte
			return a
		}
		return closed
	}

	if f.Hang {
		<-ctx.Done()
		return closed
	}

	if f.SpendCap {
		p.setHeaders(h, requestID, s.peek(keyID, now), now)
		a := errorAnswer(p, h, requestID, keyID, apiError{status: http.StatusTooManyRequests, kind: kindSpendCap})
		a.slow = f.SlowFirstByte
		return a
	}

	ok, st := s.take(keyID, now)
	p.setHeaders(h, requestID, st, now)
	if !ok {
		h.Set("retry-after", retryAfterSeconds(st.retryAfter))
		a := errorAnswer(p, h, requestID, keyID, apiError{status: http.StatusTooManyRequests})
		a.slow = f.SlowFirstByte
		return a
	}

	if sleep(ctx, s.latency()) != nil {
		return closed
	}

	a := s.respond(p, h, requestID, keyID, r, body, f)
	a.slow = f.SlowFirstByte
	return a
}

// respond decides an answer for a request that passed the bucket.
func (s *Server) respond(p provider, h http.Header, requestID, keyID string, r *http.Request, body []byte, f Faults) answer {
	if status, ok := s.injectedStatus(p); ok {
		if f.RetryAfter > 0 {
			h.Set("retry-after", retryAfterSeconds(f.RetryAfter))
		} else if status == http.StatusTooManyRequests {
			h.Set("retry-after", "1")
		}
		return errorAnswer(p, h, requestID, keyID, apiError{status: status})
	}
	if msg := p.checkHeaders(r); msg != "" {
		return errorAnswer(p, h, requestID, keyID, apiError{status: http.StatusBadRequest, message: msg})
	}
	req, err := parseChatRequest(body)
	if err != nil {
		return errorAnswer(p, h, requestID, keyID, apiError{status: http.StatusBadRequest, message: err.Error()})
	}
	if bytes.Contains(body, []byte(f.BadRequestMarker)) {
		return errorAnswer(p, h, requestID, keyID, apiError{
			status:  http.StatusBadRequest,
			message: "request contains the llmsim bad-request marker",
		})
	}
	text := replyText(req)
	sum := sha256.Sum256(body)
	return answer{
		status: http.StatusOK,
		keyID:  keyID,
		header: h,
		body: p.successBody(reply{
			id:           p.idPrefix() + hex.EncodeToString(sum[:12]),
			model:        req.model,
			text:         text,
			inputTokens:  tokens(req.textBytes),
			outputTokens: tokens(len(text)),
			created:      s.cfg.Now(),
		}),
	}
}

// injectedStatus applies the overload window, then FailNext, then ErrorRate.
func (s *Server) injectedStatus(p provider) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := &s.faults
	switch {
	case s.cfg.Now().Before(f.OverloadedUntil):
		return p.overloadStatus(), true
	case f.FailNext > 0:
		f.FailNext--
		return f.FailNextStatus, true
	case f.ErrorRate > 0 && s.cfg.Rand() < f.ErrorRate:
		return f.ErrorStatus, true
	}
	return 0, false
}

// take charges keyID's bucket; with no limit it always succeeds and returns
// a nil state.
func (s *Server) take(keyID string, now time.Time) (bool, *bucketState) {
	if !s.limited {
		return true, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buckets[keyID]
	if b == nil {
		b = &bucket{}
		s.buckets[keyID] = b
	}
	ok, st := b.take(s.params, now)
	return ok, &st
}

// peek reports keyID's bucket without charging it; nil when unlimited.
func (s *Server) peek(keyID string, now time.Time) *bucketState {
	if !s.limited {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buckets[keyID]
	if b == nil {
		b = &bucket{}
	}
	st := b.peek(s.params, now)
	return &st
}

// latency draws Latency + U(0, LatencyJitter).
func (s *Server) latency() time.Duration {
	d := s.cfg.Latency
	if s.cfg.LatencyJitter > 0 {
		s.mu.Lock()
		d += time.Duration(s.cfg.Rand() * float64(s.cfg.LatencyJitter))
		s.mu.Unlock()
	}
	return d
}

func errorAnswer(p provider, h http.Header, requestID, keyID string, e apiError) answer {
	return answer{status: e.status, keyID: keyID, header: h, body: p.errorBody(e, requestID)}
}

// writeAnswer sends a; with a.slow it sends the headers, flushes and waits
// before the body. Write errors mean the client left; there is no one to tell.
func writeAnswer(ctx context.Context, w http.ResponseWriter, a answer) {
	h := w.Header()
	for k, v := range a.header {
		h[k] = v
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(a.body)))
	w.WriteHeader(a.status)
	if a.slow > 0 {
		_ = http.NewResponseController(w).Flush()
		if sleep(ctx, a.slow) != nil {
			return
		}
	}
	_, _ = w.Write(a.body)
}

// sleep waits d or until ctx is done, whichever is first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait %s: %w", d, ctx.Err())
	}
}

func (s *Server) serveStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Stats())
}

func (s *Server) serveReset(w http.ResponseWriter, _ *http.Request) {
	s.Reset()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) serveGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.Faults())
}

func (s *Server) servePostFaults(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxControlBodyBytes))
	if err != nil {
		writeControlError(w, http.StatusBadRequest, fmt.Sprintf("read faults body: %v", err))
		return
	}
	var f Faults
	if err := strictUnmarshal(body, &f); err != nil {
		writeControlError(w, http.StatusBadRequest, fmt.Sprintf("decode faults: %v", err))
		return
	}
	if err := s.SetFaults(f); err != nil {
		writeControlError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, s.Faults())
}

// writeControlError answers a control request in llmq's error format.
func writeControlError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{
		"type":    "invalid_request_error",
		"message": message,
	}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v) // the client left: nothing to do
}
