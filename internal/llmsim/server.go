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
	tokens   tokenLimits
	mux      *http.ServeMux
	inFlight atomic.Int64
	seq      atomic.Uint64

	mu      sync.Mutex // guards the fields below and calls to cfg.Rand
	start   Faults     // as configured, restored by Reset
	faults  Faults     // resolved: defaults filled, OverloadedFor applied
	buckets map[string]*bucket
	keyToks map[string]*keyTokens
	stats   Stats
	// batches holds the batch APIs' batches and files (batch.go), under its own lock.
	batches *batchStore
}

// New returns a simulator for cfg. It panics if cfg is invalid (see
// [Config.Validate]); callers taking configuration from users validate first.
func New(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic("llmsim: invalid config: " + err.Error())
	}
	cfg = cfg.withDefaults()
	tokens, err := newTokenLimits(cfg)
	if err != nil {
		panic("llmsim: invalid config: " + err.Error()) // unreachable: Validate checked it
	}
	s := &Server{
		cfg:     cfg,
		limited: cfg.Capacity > 0,
		start:   cfg.Faults,
		faults:  cfg.Faults.resolve(cfg.Now()),
		tokens:  tokens,
		buckets: map[string]*bucket{},
		keyToks: map[string]*keyTokens{},
		stats:   newStats(),
		batches: newBatchStore(),
	}
	if s.limited {
		s.params = newBucketParams(cfg.Capacity, cfg.RefillPerSecond)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/messages", s.serveChat(anthropic{}))
	mux.HandleFunc("POST /v1/chat/completions", s.serveChat(openAI{}))
	s.batchRoutes(mux)
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
	s.keyToks = map[string]*keyTokens{}
	s.faults = s.start.resolve(s.cfg.Now())
}

// answer is a decided response.
type answer struct {
	status int
	keyID  string
	header http.Header
	body   []byte
	slow   time.Duration
	// stream, when set, is sent as an event stream instead of body.
	stream *streamAnswer
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
		p.setTokenHeaders(h, s.peekTokens(keyID, p, now), now)
		a := errorAnswer(p, h, requestID, keyID, apiError{status: http.StatusTooManyRequests, kind: kindSpendCap})
		a.slow = f.SlowFirstByte
		return a
	}

	var cost *tokenCost
	if s.tokens.enabled() {
		cost = requestCost(body)
	}
	adm := s.admit(p, keyID, cost)
	now = adm.at
	p.setHeaders(h, requestID, adm.req, now)
	if adm.refusal != nil {
		p.setTokenHeaders(h, adm.tokens, now)
		if adm.refusal.status == http.StatusTooManyRequests && !adm.neverFits {
			h.Set("retry-after", retryAfterSeconds(adm.retryAfter))
		}
		a := errorAnswer(p, h, requestID, keyID, *adm.refusal)
		a.slow = f.SlowFirstByte
		return a
	}

	if sleep(ctx, s.latency()) != nil {
		s.settle(keyID, p, cost, 0, s.cfg.Now())
		return closed
	}

	a, output := s.respond(p, h, requestID, keyID, r, body, f)
	at := s.cfg.Now()
	p.setTokenHeaders(h, s.settle(keyID, p, cost, output, at), at)
	a.slow = f.SlowFirstByte
	return a
}

// respond decides an answer for a request that passed the buckets. It also
// returns the output tokens of a successful answer, 0 otherwise.
func (s *Server) respond(p provider, h http.Header, requestID, keyID string, r *http.Request, body []byte, f Faults) (answer, int) {
	if status, ok := s.injectedStatus(p); ok {
		if f.RetryAfter > 0 {
			h.Set("retry-after", retryAfterSeconds(f.RetryAfter))
		} else if status == http.StatusTooManyRequests {
			h.Set("retry-after", "1")
		}
		return errorAnswer(p, h, requestID, keyID, apiError{status: status}), 0
	}
	if msg := p.checkHeaders(r); msg != "" {
		return errorAnswer(p, h, requestID, keyID, apiError{status: http.StatusBadRequest, message: msg}), 0
	}
	req, err := parseChatRequest(body)
	if err == nil && s.tokens.enabled() {
		err = req.maxTokensErr
	}
	if err != nil {
		return errorAnswer(p, h, requestID, keyID, apiError{status: http.StatusBadRequest, message: err.Error()}), 0
	}
	if e, over := s.overContext(p, req); over {
		return errorAnswer(p, h, requestID, keyID, e), 0
	}
	if bytes.Contains(body, []byte(f.BadRequestMarker)) {
		return errorAnswer(p, h, requestID, keyID, apiError{
			status:  http.StatusBadRequest,
			message: "request contains the llmsim bad-request marker",
		}), 0
	}
	text, maxedOut := replyText(req), false
	if n := s.cfg.ReplyTokens; n > 0 {
		if req.maxTokens > 0 && int64(n) > req.maxTokens {
			n, maxedOut = int(req.maxTokens), true
		}
		text = padReply(text, n)
	}
	// A new id for every answer, as the real APIs give: the body and this request's id.
	sum := sha256.Sum256(append(append([]byte(requestID), 0), body...))
	output := tokens(len(text))
	rep := reply{
		id:           p.idPrefix() + hex.EncodeToString(sum[:12]),
		model:        req.model,
		text:         text,
		inputTokens:  req.inputTokens(),
		outputTokens: output,
		maxedOut:     maxedOut,
		created:      s.cfg.Now(),
	}
	if req.toolName != "" {
		input := string(mustJSON(map[string]string{"reply": text}))
		for i := range max(s.cfg.ToolCalls, 1) {
			id := sum[12:24]
			if i > 0 { // another id for each call, from the answer's
				more := sha256.Sum256(append(sum[:], byte(i), byte(i>>8)))
				id = more[:12]
			}
			rep.tools = append(rep.tools, toolCall{id: p.toolIDPrefix() + hex.EncodeToString(id), name: req.toolName,
				input: input})
		}
	}
	a := answer{status: http.StatusOK, keyID: keyID, header: h}
	if req.streamRequest {
		a.stream = &streamAnswer{p: p, r: rep, includeUsage: req.includeUsage, interval: s.tokenInterval(),
			toolWhole: s.cfg.StreamToolInputWhole, toolsAtZero: s.cfg.StreamToolCallsAtIndexZero,
			toolsFrom: s.cfg.StreamToolCallsFromIndex, namesAt: s.cfg.StreamToolNamesAtIndex,
			headersFirst: s.cfg.StreamToolHeadersFirst, fail: s.streamFault()}
	} else {
		a.body = p.successBody(rep)
	}
	return a, output
}

// tokenInterval is the wait between streamed content tokens.
func (s *Server) tokenInterval() time.Duration {
	if s.cfg.StreamTokensPerSecond <= 0 {
		return 0
	}
	return time.Duration(float64(time.Second) / s.cfg.StreamTokensPerSecond)
}

// streamFault takes one count of Faults.StreamFailNext, if any is left.
func (s *Server) streamFault() *streamFault {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := &s.faults
	if f.StreamFailNext <= 0 {
		return nil
	}
	f.StreamFailNext--
	return &streamFault{after: f.StreamFailAfter, mode: f.StreamFailMode}
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

// admission is the outcome of charging a key's buckets for one request.
type admission struct {
	req        *bucketState  // the request bucket; nil when unlimited
	tokens     *tokenView    // the token buckets; nil when token limits are off
	refusal    *apiError     // 400 or 429; then nothing was charged
	retryAfter time.Duration // with a 429 refusal: until every bucket has room
	neverFits  bool          // the refusal is of a request larger than a whole bucket
	at         time.Time     // when the buckets were charged (or checked)
}

// admit charges keyID's request bucket one token and, when cost is known,
// its token buckets the request's input tokens and reserved output tokens,
// all or nothing: a request that can never fit is refused (see
// tooLargeRefusal), one that does not fit now 429. With no limit at all it
// always admits.
//
// The buckets are charged at the time admit reads under the lock (admission.at),
// not when the request arrived: a request whose handler read the clock, then
// waited (for its body, for the lock) while a later one was charged, would
// otherwise be charged in the past, against a debt that already counts the
// later request, and be refused though the bucket had room.
func (s *Server) admit(p provider, keyID string, cost *tokenCost) admission {
	if !s.limited && !s.tokens.enabled() {
		return admission{at: s.cfg.Now()}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	var (
		adm     = admission{at: now}
		b       *bucket
		saved   bucket
		reqOK   = true
		charges []tokenCharge
		kt      *keyTokens
	)
	if s.tokens.enabled() {
		kt = s.keyTokensLocked(keyID)
		adm.tokens = s.tokens.view(kt, p.combinedTokens(), now)
		if cost != nil {
			charges = s.tokens.charges(p.combinedTokens(), *cost)
		}
		for _, ch := range charges {
			if capacity := s.tokens.params(ch.kind).capacity; ch.n > capacity {
				if s.limited {
					st := s.bucketLocked(keyID).peek(s.params, now)
					adm.req = &st
				}
				adm.refusal, adm.neverFits = tooLargeRefusal(ch, *cost, capacity), true
				return adm
			}
		}
	}
	if s.limited {
		b = s.bucketLocked(keyID)
		saved = *b
		var st bucketState
		reqOK, st = b.take(s.params, now)
		adm.req = &st
		if !reqOK {
			adm.retryAfter = st.retryAfter
			adm.refusal = &apiError{status: http.StatusTooManyRequests}
		}
	}
	for _, ch := range charges {
		bk, pr := kt.bucket(ch.kind), *s.tokens.params(ch.kind)
		if wait := bk.wait(pr, ch.n); wait > 0 {
			if adm.refusal == nil {
				adm.refusal = &apiError{status: http.StatusTooManyRequests, kind: kindTokens,
					message: rateLimitedMessage(ch, *cost, bk.state(pr), wait)}
			}
			adm.retryAfter = max(adm.retryAfter, wait)
		}
	}
	if adm.refusal != nil {
		if reqOK && b != nil { // the request bucket took a token: give it back
			*b = saved
			st := b.peek(s.params, now)
			adm.req = &st
		}
		return adm
	}
	for _, ch := range charges {
		kt.bucket(ch.kind).add(*s.tokens.params(ch.kind), ch.n)
	}
	if cost != nil {
		s.stats.addTokens(keyID, cost.input, 0)
		adm.tokens = s.tokens.view(kt, p.combinedTokens(), now)
	}
	return adm
}

// settle trues up a request's output reservation to the output tokens it
// produced (0 for anything but a success) and reports the token buckets; nil
// when token limits are off. cost nil means nothing was reserved.
func (s *Server) settle(keyID string, p provider, cost *tokenCost, output int, now time.Time) *tokenView {
	if !s.tokens.enabled() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	kt := s.keyTokensLocked(keyID)
	if cost != nil {
		if k, ok := s.tokens.outputKind(p.combinedTokens()); ok {
			pr := *s.tokens.params(k)
			bk := kt.bucket(k)
			bk.advance(pr, now)
			bk.add(pr, int64(output)-cost.reserve)
		}
		s.stats.addTokens(keyID, 0, int64(output))
	}
	return s.tokens.view(kt, p.combinedTokens(), now)
}

// peekTokens reports keyID's token buckets without charging; nil when token
// limits are off.
func (s *Server) peekTokens(keyID string, p provider, now time.Time) *tokenView {
	if !s.tokens.enabled() {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tokens.view(s.keyTokensLocked(keyID), p.combinedTokens(), now)
}

func (s *Server) bucketLocked(keyID string) *bucket {
	b := s.buckets[keyID]
	if b == nil {
		b = &bucket{}
		s.buckets[keyID] = b
	}
	return b
}

func (s *Server) keyTokensLocked(keyID string) *keyTokens {
	t := s.keyToks[keyID]
	if t == nil {
		t = &keyTokens{}
		s.keyToks[keyID] = t
	}
	return t
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
	if a.stream != nil {
		writeStream(ctx, w, a)
		return
	}
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

// overContext reports whether req does not fit the model's context window (Config.ContextTokens),
// and the refusal p answers it with, online or as a batch request's result.
func (s *Server) overContext(p provider, req chatRequest) (apiError, bool) {
	if s.cfg.ContextTokens <= 0 {
		return apiError{}, false
	}
	msg := p.contextMessage(req.inputTokens(), req.maxTokens, s.cfg.ContextTokens)
	return apiError{status: http.StatusBadRequest, kind: kindContext, message: msg}, msg != ""
}
