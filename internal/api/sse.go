package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/eventsource"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tenant"
)

// eventsPreflight answers the CORS preflight (OPTIONS) of GET /v1/jobs/{id}/events. A browser's
// own EventSource sends none, but a fetch-based client (an EventSource polyfill, a fetch reader)
// sends one before any request carrying Last-Event-ID, the header that resumes a stream; a 405
// there meant such a page could never resume. Any origin may send it, as any may open a signed
// URL (events): no cookie is involved. Authorization is not allowed: a page holds a signed
// events_url, never a bearer token. The answer reveals nothing of the job (a preflight carries
// no credentials), so it needs neither the token nor the job to exist.
func eventsPreflight(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Allow-Methods", "GET")
	h.Set("Access-Control-Allow-Headers", "Last-Event-ID, Cache-Control")
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}

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
// sent, so no transition is lost between a read and a notification and none is sent twice (a
// signal of an event it has read already, as the Listener's catch-up after a reconnect mostly
// is, costs no read). The streams of one job share those reads (statusReads: one per transition
// for them all, not one each). A
// keep-alive comment every KeepAlive also renews the watch, which returns the job's latest
// event's number: the stream reads the events only when one is there that it has not read (a
// notification lost). When the client goes away the handler returns and unsubscribes: nothing
// outlives it.
//
// Streaming jobs ("stream": true) also get the entries of their delta buffer in Redis
// (internal/deltastream): "delta" and "reset" events, id "seq.n" (see eventPos), placed among the
// status events by that id. The stream follows the buffer through the process's DeltaHub; a
// wake-up from it reads Redis only.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	tokens, signed := r.URL.Query()["token"]
	if signed {
		// A signed URL carries its own authorization, and no cookie is involved: a page of any
		// origin may follow the job it was handed the URL of (and read why it may not).
		w.Header().Set("Access-Control-Allow-Origin", "*")
	}
	// The caller first, before the stream takes a place: a request that fails authentication
	// (made-up tokens, whose lookups may wait for a place of their own) never holds one of the
	// replica's stream places, which a tenant's stream would then be refused for. A known token
	// is cached, a signed URL checked in memory: neither reads Postgres, nor is bounded. A
	// token's lookup is bounded as a poll's is (storeBounded): a made-up one does not hold its
	// connection for as long as Postgres takes. Past the bound an EventSource is told to come
	// back (refuseStream), having learnt nothing of the job.
	caller, ok := s.streamCaller(w, r, tokens)
	if !ok {
		return
	}
	// The replica's stream cap next, before any read of the job: streams over it cost Postgres
	// nothing more.
	releaseServer, err := s.streams.openServer()
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	defer releaseServer()
	// The stream's reads before its headers (the job, then its watch and first read of the
	// events) are bounded as a poll's are, together (storeBounded): a stream does not hold its
	// connection, nor a goroutine, for as long as Postgres takes to answer them. Past the bound
	// the client is answered as at its authentication (refuseStream).
	first, stopOpening := s.storeBounded(r)
	defer stopOpening()
	// The job next: who may not see it learns nothing from the header's validation.
	job, streams, err := s.streamJob(first, caller, signed)
	if err != nil {
		s.refuseStream(w, first, err)
		return
	}
	last, resume, err := lastEventID(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	if resume && job.Status.Terminal() && last.seq >= job.EventSeq {
		// The client has the terminal event: nothing will ever follow. 204 is what makes an
		// EventSource stop reconnecting (a 200 with an empty stream makes it come back forever).
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if resume && last.seq > job.EventSeq {
		// Events are committed before any stream sends them: the client never had this one, and
		// waiting for it would skip every event up to it, the terminal one too.
		writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusBadRequest, typ: "invalid_last_event_id",
			message: fmt.Sprintf("Last-Event-ID %d is past the job's latest event (%d): not an event id of this stream", last.seq, job.EventSeq)})
		return
	}
	release, err := s.streams.open(job.Tenant)
	if err != nil {
		var he *httpError
		if errors.As(err, &he) {
			// A signed URL or a token names the job's tenant; a request with neither is anonymous.
			_, withToken := r.Header["Authorization"]
			err = s.overShare(r, job.Tenant, signed || withToken, he)
		}
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	defer release()
	// Registered before the subscription: the job's shared reads (statusReads) live as long as
	// a stream of it does.
	defer s.reads.follow(job.ID)()
	var notify <-chan int
	if s.cfg.Listener != nil {
		ch, unsubscribe := s.cfg.Listener.Subscribe(job.ID)
		defer unsubscribe()
		notify = ch
	}
	f := &follower{streaming: s.cfg.Deltas != nil && streams}
	var deltasGrew <-chan struct{}
	if f.streaming && s.cfg.DeltaHub != nil {
		// Followed before the first read of the buffer, like the Listener.
		f.hub = s.cfg.DeltaHub.Follow(r.Context(), job.ID)
		defer f.hub.Stop()
		deltasGrew = f.hub.Wake()
	}
	// Postgres announces only watched jobs' transitions (NOTIFY serializes commits); watch
	// before the first read, and renew at every keep-alive. The watch and the first read of
	// the status events and the job go in one round trip (jobs.Store.WatchAndRead); a stream
	// opened on an ended job for its terminal event takes the job's shared read (openingRead).
	after := last.seq
	switch {
	case !resume:
		after = job.EventSeq - 1 // the job may have moved on since: the events read cover that
	case last.n > 0:
		after = last.seq - 1 // the attempt's running event too (not sent again): its number
	}
	read, err := s.openingRead(first, job, after)
	if err != nil {
		s.refuseStream(w, first, err)
		return
	}
	stopOpening()
	evs, fresh := read.evs, read.job
	if !resume {
		// The job read now that we are subscribed: any transition after this read is
		// signalled, so starting at its latest event loses nothing.
		last = eventPos{seq: fresh.EventSeq - 1, n: math.MaxInt}
		if fresh.Status.Terminal() {
			// The stream starts at the terminal event, which carries the whole answer, and ends
			// with it: it sends no delta, so it reads none (it read the whole buffer to drop it).
			f.streaming = false
		}
	}
	f.pos, f.known = last, last.seq
	if resume && last.n > 0 && f.streaming {
		// The client shows this attempt's deltas: a retry must be preceded by a reset, even
		// when the buffer no longer holds the entry it resumes after (its TTL, its bound).
		f.resumeInAttempt(evs, last)
	}
	f.read = read

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// The server's read timeout would end a stream that outlives it; the client sends nothing
	// more. Writes get a deadline each instead of the server's one for the whole answer.
	_ = rc.SetReadDeadline(time.Time{})
	out := &deadlineWriter{w: w, rc: rc, timeout: s.cfg.EventWriteTimeout, now: s.cfg.writeNow, closing: s.closing}
	keepAlive := s.startKeepAlive()
	defer keepAlive.stop()
	reads := readStatus
	// need is the event a notification or a watch announced, 0 if none (see statusReads.read).
	need := 0
	var authedUntil time.Time // the stream's token is checked again after this
	for {
		if !time.Now().Before(authedUntil) {
			if refusal := s.streamRefusal(r, job, signed); refusal != nil {
				endRefused(out, rc, refusal)
				return
			}
			authedUntil = time.Now().Add(s.authRecheck())
		}
		done, err := s.sendEvents(out, r, job.ID, f, reads, need)
		if err != nil {
			// Headers are sent: the stream just ends, and the client resumes with Last-Event-ID.
			if r.Context().Err() == nil && !errors.Is(err, errShuttingDown) {
				s.streamWarn(r.Context(), "event stream ended on an error", job.ID, err)
			}
			return
		}
		if done {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		reads, need = readStatus, 0
		select {
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		case v := <-notify:
			need = v
			if v > 0 && v <= f.known {
				// Every event up to v is committed and read, and none past it was announced:
				// nothing to read (the Listener's catch-up after it reconnected, mostly).
				reads = readNone
			}
		case <-deltasGrew:
			reads = readHub // the published entries only: no Postgres read per delta
		case <-keepAlive.ticks:
			keepAlive.ticked()
			if _, err := io.WriteString(out, ": keep-alive\n\n"); err != nil {
				return
			}
			reads, need = s.keepAliveReads(r, job.ID, f)
		}
	}
}

// openingRead is a stream's first read of its job's status events after after, and of the job,
// job being what its head read found (streamJob). A job that had ended then is read through its
// streams' shared reads (statusReads.read), taking one that holds its terminal event: the
// streams opened on an ended job share one read of it, and one encoding of its terminal event,
// which carries the whole result, instead of a read and an encoding each (100 streams never read
// of a job with a 12 MB result held 1.85 GB of live heap). Such a stream makes no watch: it
// sends the terminal event and ends. Only a stream that sends the terminal event alone (after
// is the event before it) does so: each event of a replay carries the job, its result too, and
// a shared read keeps its events' encodings for as long as it is kept, where a replay of its own
// holds one at a time. A read that finds the job moved on since (an operator retried it), a
// replay and a job not ended are read as before: the watch, then the events and the job, in one
// round trip (jobs.Store.WatchAndRead).
func (s *Server) openingRead(r *http.Request, job *jobs.Job, after int) (*statusRead, error) {
	if job.Status.Terminal() && after >= job.EventSeq-1 {
		read, err := s.reads.read(r.Context(), job.ID, after, job.EventSeq)
		if err != nil {
			return nil, err
		}
		if read.ends() {
			return read, nil
		}
	}
	evs, fresh, err := s.cfg.Store.WatchAndRead(r.Context(), job.ID, s.reads.watchTTL, after)
	if err != nil {
		return nil, err
	}
	return &statusRead{evs: evs, job: fresh}, nil
}

// ticker is a running ticker: *time.Ticker, or a test's.
type ticker interface {
	Reset(d time.Duration)
	Stop()
}

// newTimeTicker is Config.newTicker's default: a *time.Ticker.
func newTimeTicker(d time.Duration) (<-chan time.Time, ticker) {
	t := time.NewTicker(d)
	return t.C, t
}

// streamKeepAlive is an event stream's keep-alive ticks (ticks): the first firstKeepAlive
// after the stream opened, then every KeepAlive. Every stream's ticker ticked every KeepAlive
// from its open: the 5,000 streams a reconnect storm opened together renewed their watches in
// one burst at each keep-alive, for as long as they lived.
type streamKeepAlive struct {
	ticks  <-chan time.Time
	ticker ticker // nil: ticks are a test's (Config.keepAliveTicks)
	every  time.Duration
	steady bool // the first tick was taken: the ticker ticks every `every`
}

// startKeepAlive starts a stream's keep-alive ticks.
func (s *Server) startKeepAlive() streamKeepAlive {
	if s.cfg.keepAliveTicks != nil {
		return streamKeepAlive{ticks: s.cfg.keepAliveTicks}
	}
	ticks, t := s.cfg.newTicker(firstKeepAlive(s.cfg.KeepAlive, s.cfg.keepAliveRand()))
	return streamKeepAlive{ticks: ticks, ticker: t, every: s.cfg.KeepAlive}
}

// ticked is called at each tick taken: the first sets the ticker to every KeepAlive.
func (k *streamKeepAlive) ticked() {
	if k.ticker != nil && !k.steady {
		k.steady = true
		k.ticker.Reset(k.every)
	}
}

// stop stops the ticker.
func (k *streamKeepAlive) stop() {
	if k.ticker != nil {
		k.ticker.Stop()
	}
}

// firstKeepAlive is when a stream's first keep-alive falls after it opened, for the draw r in
// [0, 1): in [every/2, every). No later than every, so that its watch (4 keep-alives) is renewed
// as often as before; no sooner than every/2, which the job's streams' shared renewals serve
// (statusReads.renew).
func firstKeepAlive(every time.Duration, r float64) time.Duration {
	half := every / 2
	return half + time.Duration(r*float64(every-half))
}

// refuseStream answers a request for an event stream that failed before its headers with err:
// writeError's answer, but for a 503 (no pool connection in time, Postgres not answering in
// time or unreachable: what passes) to a client that takes event streams (Accept:
// text/event-stream, which every EventSource sends). An EventSource ends for good on any answer
// but a 200 event stream (the SSE spec's "fail the connection"), and one that ends makes it
// reconnect after its reconnection time: such a client is answered a 200 event stream that holds
// only a retry field and a comment naming the error, and ends. The retry is a full-jitter draw
// below the 503's Retry-After (in milliseconds): every page refused in the same slowdown would
// otherwise come back in the same millisecond. It carries no id (the client keeps its
// Last-Event-ID) and nothing of the job: it is answered before the job is read, or before its
// caller is known. Any other client is answered the 503 (a 200 would tell curl the stream ended).
// A failure of the server (the store unreachable, or past its bound) is logged as the streams'
// other failures are (streamLog: one line per message and streamLogInterval, counting those held
// back): the pages an outage refuses each come back within seconds, and a line each flooded the
// log.
func (s *Server) refuseStream(w http.ResponseWriter, r *http.Request, err error) {
	he, failure := classifyError(r, err)
	if he == nil {
		return
	}
	if failure != nil {
		attrs := []any{"method", r.Method, "path", r.URL.Path, "error", err}
		if log, suppressed := s.streamLog.AllowAt(failure.msg, failure.level, attrs...); log {
			s.cfg.Logger.Log(r.Context(), failure.level, failure.msg, append(attrs, "suppressed", suppressed)...)
		}
	}
	retryAfter, convErr := strconv.Atoi(he.header.Get("Retry-After"))
	if he.status != http.StatusServiceUnavailable || convErr != nil || !eventsource.Accepts(r) {
		writeError(w, r, s.cfg.Logger, he)
		return
	}
	w.Header().Set("Cache-Control", "no-cache")
	eventsource.Refuse(w, he.typ, he.message, retryAfter, s.cfg.retryRand())
}

// streamReads is what a stream's wake-up reads (see sendEvents).
type streamReads int

const (
	// readStatus reads the job's status events and the job from Postgres, then a streaming
	// job's delta buffer from Redis: a notification, the stream's first send.
	readStatus streamReads = iota
	// readHub takes a streaming job's entries the DeltaHub received (Redis only when they do not
	// follow the last one read): the hub's wake-up.
	readHub
	// readBuffer reads a streaming job's delta buffer from Redis, nothing from Postgres: a
	// keep-alive that found no status event the stream has not read (a lost wake-up of the hub
	// is caught up there).
	readBuffer
	// readNone reads nothing: a notification of an event the stream has read.
	readNone
)

// keepAliveReads renews the stream's watch of the job at a keep-alive, and returns what the
// stream reads then: its status events only when the watch found an event the stream has not
// read (its notification lost, or no Listener), so that an idle stream costs Postgres one
// statement per keep-alive at most, not three (10,000 idle streams were 2,000 statements a
// second at the default 15s); need is then that event's number (see statusReads.read). The
// job's streams share their renewals (statusReads.renew: one per half keep-alive for them all).
// A job gone (deleted past its retention) is read too: the read ends the stream, as it did. A
// failed renewal (the store down, or no pool connection within StoreWait) is logged (streamWarn:
// throttled) and the stream goes on; the next keep-alive renews it again, within the watch's TTL
// of 4 keep-alives, and learns what was missed.
func (s *Server) keepAliveReads(r *http.Request, id string, f *follower) (reads streamReads, need int) {
	rw, err := s.reads.renew(r.Context(), id, f.renewal)
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		return readStatus, 0
	case err != nil:
		if r.Context().Err() == nil {
			s.streamWarn(r.Context(), "renew event watch", id, err)
		}
		return readBuffer, 0
	}
	f.renewal = rw
	if rw.seq > f.known {
		return readStatus, rw.seq
	}
	return readBuffer, 0
}

// streamWarn logs a stream's failure (of job id): one line per streamLogInterval and message,
// every stream's together, which counts the lines left out since the last ("suppressed") and
// names the job and the error of the one logged. A store failing fails every stream's renewal
// or read at once: 10,000 streams wrote 670 lines a second in a Postgres outage, one each.
func (s *Server) streamWarn(ctx context.Context, msg, id string, err error) {
	attrs := []any{"job_id", id, "error", err}
	if log, suppressed := s.streamLog.Allow(msg, attrs...); log {
		s.cfg.Logger.WarnContext(ctx, msg, append(attrs, "suppressed", suppressed)...)
	}
}

// streamsSuppressed logs the streams' failures of message msg that streamWarn (or refuseStream)
// held back and no line of it counted since: the last of an outage (streamLog's Report). The line
// is the last one held back's (its job and error, or its request's method, path and error),
// counting them all: it said only how many, and an operator had no job to look at, nor the
// error that the failures ended on (TestStreamWarn_ReportNamesTheLastJobAndError). It is at the
// highest level among those held back: it was a warning, a refused stream's internal errors
// (an error each) too (TestStreamsSuppressed_ReportsAtTheHighestLevelHeldBack).
func (s *Server) streamsSuppressed(msg string, level slog.Level, suppressed int, last []any) {
	s.cfg.Logger.Log(context.Background(), level, msg, append(slices.Clip(last), "suppressed", suppressed)...)
}

// streamRefusal checks again the token of a stream (of job) that was served: the answer that
// now refuses it (its tenant revoked, its bearer token rotated out, or gone with its deleted
// tenant: within the tenants' cache TTL of it, as every request of it), which ends the stream
// (endRefused), at its next wake-up or keep-alive; nil when it may go on. A signed URL's is its
// tenant's revocation (signedTenant; a URL that expired meanwhile still runs to the job's end).
// An answer at hand in the tenants' cache (streamRecheck's, cachedOnly: the check that starts
// every stream, its opening's answer just cached, and any within the cache TTL of another
// request of the tenant's) is taken as it is; only a lookup is bounded as the stream's
// authentication was (storeBounded): it held the stream, its events and keep-alives included,
// for as long as Postgres took to answer. The bounds were made for a cached answer too, 14
// allocations a check (TestServer_StreamRefusalAllocs). A store error,
// that bound passing included, does not end the stream: it is logged (streamWarn: throttled),
// and the token is checked again after authRecheck, as after a success (Postgres not answering
// says nothing of the token).
func (s *Server) streamRefusal(r *http.Request, job *jobs.Job, signed bool) *httpError {
	err := s.streamRecheck(r, job, signed, true)
	if errors.Is(err, tenant.ErrNotCached) {
		ar, stop := s.storeBounded(r)
		defer stop()
		err = s.streamRecheck(ar, job, signed, false)
	}
	if err == nil {
		return nil // before errors.As, whose target escapes: an allocation
	}
	var refused *httpError
	switch {
	case errors.As(err, &refused):
		return refused
	case r.Context().Err() == nil:
		s.streamWarn(r.Context(), "check event stream's token again", job.ID, err)
	}
	return nil
}

// streamRecheck is streamRefusal's answer (signedTenant's, or tenant's): from the tenants' cache
// alone when cachedOnly, tenant.ErrNotCached when it holds none fresh (signedTenant's and
// cachedTenant's).
func (s *Server) streamRecheck(r *http.Request, job *jobs.Job, signed, cachedOnly bool) error {
	if signed {
		return s.checkSignedTenant(r, job.Tenant, cachedOnly)
	}
	_, err := s.identify(r, cachedOnly)
	return err
}

// endRefused ends a stream whose token is refused now (streamRefusal) with a "refused" event
// whose data is the refusal, as the API answers it ({"error":{"type","message"}}), without an
// id (the client keeps its Last-Event-ID): a client that reconnects, as an EventSource does after
// any stream that ends, is answered that refusal (a 4xx, which ends an EventSource for good), and
// one that listens for the event knows why before.
func endRefused(out io.Writer, rc *http.ResponseController, refusal *httpError) {
	data, err := json.Marshal(map[string]any{"error": map[string]string{"type": refusal.typ,
		"message": refusal.message}})
	if err != nil {
		return
	}
	frame := append(append([]byte("event: refused\ndata: "), data...), "\n\n"...)
	if _, err := out.Write(frame); err == nil {
		_ = rc.Flush()
	}
}

// authRecheck is how long a stream goes before its token (a bearer token, or a signed URL's
// tenant) is checked again: the tenants' cache TTL, which a revocation takes to reach this
// process anyway.
func (s *Server) authRecheck() time.Duration {
	if s.cfg.Tenants == nil {
		return time.Second
	}
	return s.cfg.Tenants.TTL()
}

// eventPos is an event's place in a job's stream: status event seq is (seq, 0); the n-th entry
// (delta or reset) of the attempt whose running event is seq is (seq, n). Its SSE id is "seq" or
// "seq.n", so that Last-Event-ID resumes between any two events, inside an attempt too.
type eventPos struct{ seq, n int }

func (p eventPos) after(q eventPos) bool { return p.seq > q.seq || p.seq == q.seq && p.n > q.n }

// appendID appends the SSE id ("seq" or "seq.n") to b.
func (p eventPos) appendID(b []byte) []byte {
	b = strconv.AppendInt(b, int64(p.seq), 10)
	if p.n != 0 {
		b = strconv.AppendInt(append(b, '.'), int64(p.n), 10)
	}
	return b
}

// lastEventID parses the Last-Event-ID header ("seq" or "seq.n"): resume is false without it.
func lastEventID(r *http.Request) (last eventPos, resume bool, err error) {
	v := strings.TrimSpace(r.Header.Get("Last-Event-ID"))
	if v == "" {
		return eventPos{}, false, nil
	}
	seqText, nText, hasN := strings.Cut(v, ".")
	seq, err := eventNumber(seqText)
	n := 0
	if err == nil && hasN {
		n, err = eventNumber(nText)
	}
	if err != nil {
		return eventPos{}, false, &httpError{status: http.StatusBadRequest, typ: "invalid_last_event_id", message: fmt.Sprintf("Last-Event-ID %q must be an event id of this stream: a sequence number, or seq.n", truncateValue(v))}
	}
	return eventPos{seq: seq, n: n}, true, nil
}

// eventNumber parses one part of an event id: decimal digits only (no sign, as the contract's
// pattern says), within Postgres's integer, which job_events.seq is (a larger number is no event
// id of any stream, and would fail the read as a 500).
func eventNumber(s string) (int, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, strconv.ErrSyntax
	}
	n, err := strconv.ParseInt(s, 10, 32)
	return int(n), err
}

// follower is one event stream's progress: pos, the last event sent; last, the last entry of the
// job's delta buffer read.
type follower struct {
	streaming bool
	// hub receives the entries written to the job's buffer (nil: read the buffer each time).
	hub *deltastream.Follower
	pos eventPos
	// last is the last entry of the job's buffer read (the zero Entry: none).
	last deltastream.Entry
	// open is the attempt whose deltas this stream sent and that no reset or terminal event has
	// closed yet (seq 0: none), and openAttempt its number.
	open        eventPos
	openAttempt int
	// void is the attempt (its running event's seq; 0: none) whose entries this stream stopped
	// sending at a hole: an entry that does not follow the last one sent (Redis lost the buffer
	// mid-attempt, trimmed it past where the stream stands, or a write failed). Its deltas are not
	// sent (its reset is): the client is never shown a text with a piece missing, and gets the
	// whole answer in the terminal event.
	void int
	// known is the newest status event read (sent or not).
	known int
	// renewal is the last renewal of the job's watch the stream took (statusReads.renew).
	renewal *watchRenewal
	// read, when set, is a read of the status events and the job the stream made as it opened,
	// which its first sendEvents takes instead of reading them.
	read *statusRead
	// items and frame are sendEvents's buffers, reused from one wake-up to the next.
	items []streamItem
	frame []byte
}

// statusRead is a read of a job's status events after some sequence number, and of the job.
type statusRead struct {
	evs []jobs.Event
	job *jobs.Job
	// shared, when set, is the shared read (statusReads) evs are of, from its event first on:
	// it holds their encodings (eventData).
	shared *sharedRead
	first  int
}

// streamItem is one event to send.
type streamItem struct {
	pos  eventPos
	name string
	data []byte
	// attempt is a delta's attempt number (deltastream.Entry.Attempt).
	attempt int
	// status, when above 0, makes it the status event status-1 of the read, whose data is
	// encoded when it is written (statusRead.eventData).
	status int
}

// sendEvents writes the job's events after f.pos, in order, and advances f.pos: its status
// events (from Postgres) and, for a streaming job, the entries of its delta buffer (from Redis).
// The worker writes an attempt's entries before it records the attempt's outcome, so after a
// read of the status events, a read of the buffer has every entry that precedes them; an entry
// of a newer attempt than the status events read makes them read again. Woken by the buffer
// or a keep-alive (reads readHub, readBuffer) it reads Redis only, so that deltas and idle
// streams cost no Postgres read: entries of attempts already known precede any status event not
// read yet. need is the event a notification or a watch announced, 0 if none (see
// statusReads.read). done is true when the job is terminal and its latest event has been sent:
// the stream is complete.
func (s *Server) sendEvents(w io.Writer, r *http.Request, id string, f *follower, reads streamReads, need int) (done bool, err error) {
	status := reads == readStatus
	var read *statusRead
	switch {
	case status && f.read != nil:
		read, f.read = f.read, nil
	case status:
		if read, err = s.reads.read(r.Context(), id, f.pos.seq, need); err != nil {
			return false, err
		}
	}
	if read != nil {
		f.noteStatus(read.evs)
	}
	var entries []deltastream.Entry
	if f.streaming && reads != readNone {
		entries = s.readDeltas(r, id, f, reads == readHub)
		if len(entries) > 0 && entries[len(entries)-1].Seq > f.known {
			// An attempt this stream has not read the running event of: a read begun now has
			// it (its entries follow its commit).
			if read, err = s.reads.read(r.Context(), id, f.pos.seq, 0); err != nil {
				return false, err
			}
			f.noteStatus(read.evs)
			// Those status events may follow entries written after the ones just taken (the
			// attempt's later deltas and its reset, written before its outcome was recorded,
			// and not yet handed on by the hub or read): a read of the buffer now has every
			// entry that precedes them. Without it the stream sent the retry first, with a
			// reset of its own, and dropped the attempt's later deltas as past.
			entries = append(entries, s.readDeltas(r, id, f, false)...)
		}
	}
	var job *jobs.Job
	items := f.items[:0] // reused: a stream writes an event or two per wake-up, thousands of times
	if read != nil {
		// Encoded as each is written, not all before the first: a replay (Last-Event-ID: 0) of a
		// job of many events, each carrying the job (its result too), holds one encoding at a
		// time, and the client has its first event after one encoding, not all of them.
		job = read.job
		for i, ev := range read.evs {
			items = append(items, streamItem{pos: eventPos{seq: ev.Seq}, name: string(ev.Type), status: i + 1})
		}
	}
	for _, e := range entries {
		items = append(items, streamItem{pos: eventPos{seq: e.Seq, n: e.N}, name: e.Kind, data: e.Data, attempt: e.Attempt})
	}
	slices.SortStableFunc(items, func(a, b streamItem) int {
		return cmp.Or(cmp.Compare(a.pos.seq, b.pos.seq), cmp.Compare(a.pos.n, b.pos.n))
	})
	for _, it := range items {
		if !it.pos.after(f.pos) {
			switch {
			case it.pos == f.pos && it.name == deltastream.KindDelta:
				// A stream resumed right after this delta: its attempt is open, and a retry
				// that starts over must be preceded by its reset.
				f.open, f.openAttempt = it.pos, it.attempt
			case it.pos == f.pos && it.name == deltastream.KindReset:
				f.open = eventPos{} // resumed right after the reset: none is owed
			}
			continue // sent before (a resumed stream), or an entry of an attempt already over
		}
		if it.pos.n != 0 && !f.follows(it) {
			continue // past a hole in the attempt's entries: see follower.void
		}
		if reset, ok := f.lostReset(it); ok {
			if err := f.write(w, reset); err != nil {
				return false, err
			}
		}
		if it.status > 0 {
			if it.data, err = read.eventData(it.status - 1); err != nil {
				return false, err
			}
		}
		if err := f.write(w, it); err != nil {
			return false, err
		}
		f.sent(it)
	}
	clear(items) // holds no event's data past this wake-up
	f.items = items[:0]
	return job != nil && job.Status.Terminal() && f.pos.seq >= job.EventSeq, nil
}

// resumeInAttempt marks the attempt of the running event at last.seq open for a stream resumed
// at last (seq.n, inside the attempt): the client shows its deltas, whether or not the buffer
// still holds them.
func (f *follower) resumeInAttempt(evs []jobs.Event, last eventPos) {
	for _, ev := range evs {
		if ev.Seq != last.seq || ev.Type != jobs.StatusRunning {
			continue
		}
		var p struct {
			Attempt int `json:"attempt"`
		}
		if json.Unmarshal(ev.Payload, &p) == nil {
			f.open, f.openAttempt = last, p.Attempt
		}
	}
}

// noteStatus records the newest status event read.
func (f *follower) noteStatus(evs []jobs.Event) {
	for _, ev := range evs {
		f.known = max(f.known, ev.Seq)
	}
}

// maxKeptFrame bounds the frame buffer a stream keeps between events.
const maxKeptFrame = 64 << 10

// write writes it as one SSE frame, built in the follower's reused buffer. Data larger than
// maxKeptFrame (a result) is written as it is, after the frame's head: it is the encoding the
// job's streams share (statusRead.eventData), and a copy in each stream's frame was held, by a
// client that does not read, until the stream's write timeout.
func (f *follower) write(w io.Writer, it streamItem) error {
	b := append(append(append(f.frame[:0], "event: "...), it.name...), "\nid: "...)
	b = append(it.pos.appendID(b), "\ndata: "...)
	if len(it.data) > maxKeptFrame {
		f.frame = b
		if _, err := w.Write(b); err != nil {
			return err
		}
		if _, err := w.Write(it.data); err != nil {
			return err
		}
		_, err := io.WriteString(w, "\n\n")
		return err
	}
	b = append(append(b, it.data...), "\n\n"...)
	f.frame = b
	if cap(b) > maxKeptFrame {
		f.frame = nil // not kept for the stream's life
	}
	_, err := w.Write(b)
	return err
}

// sent records it as sent.
func (f *follower) sent(it streamItem) {
	f.pos = it.pos
	switch {
	case it.name == deltastream.KindDelta:
		f.open, f.openAttempt = it.pos, it.attempt
	case it.pos.n == 0 || it.name == deltastream.KindReset:
		f.open = eventPos{}
	}
}

// follows reports whether entry it may be sent after the stream's last event: it is the entry
// right after it (the first of its attempt right after the running event), or a reset. An entry
// that is not marks its attempt void: none of its deltas is sent after the hole.
func (f *follower) follows(it streamItem) bool {
	if it.name == deltastream.KindReset {
		return true // drops what the client shows: never harmful
	}
	if f.void == it.pos.seq {
		return false
	}
	if it.pos.seq == f.pos.seq && it.pos.n == f.pos.n+1 {
		return true
	}
	f.void = it.pos.seq
	return false
}

// lostReset is the reset a stream sends itself when the attempt it streamed is followed by a
// status event that starts over (running again, retrying) with no reset entry between: the worker
// died mid-stream, or its reset never reached Redis. Its id is the one the entry would have had.
func (f *follower) lostReset(next streamItem) (streamItem, bool) {
	if f.open.seq == 0 || next.pos.n != 0 || jobs.Status(next.name).Terminal() {
		return streamItem{}, false
	}
	data, _ := json.Marshal(map[string]int{"attempt": f.openAttempt})
	return streamItem{pos: eventPos{seq: f.open.seq, n: f.open.n + 1}, name: deltastream.KindReset, data: data}, true
}

// deltaPage is how many buffer entries one read takes.
const deltaPage = 1000

// readDeltas returns the job's buffer entries after f.last and advances it. Woken by the hub
// (fromHub), it takes the entries the hub received when they follow the last one read, and reads
// the buffer only when they do not; any other wake-up reads the buffer (a read of status events
// is always followed by one: see sendEvents). Redis failing costs the stream its deltas, not its
// status events: the failure is logged (streamWarn: throttled) and the stream goes on.
func (s *Server) readDeltas(r *http.Request, id string, f *follower, fromHub bool) []deltastream.Entry {
	if fromHub && f.hub != nil {
		if entries, ok := f.hub.Next(f.last); ok {
			if len(entries) > 0 {
				f.last = entries[len(entries)-1]
			}
			return entries
		}
	}
	var out []deltastream.Entry
	for {
		page, err := s.cfg.Deltas.Read(r.Context(), id, f.last.ID, deltaPage)
		if err != nil {
			if r.Context().Err() == nil {
				s.streamWarn(r.Context(), "read stream deltas", id, err)
			}
			return out
		}
		if len(page) > 0 {
			f.last = page[len(page)-1]
		}
		out = append(out, page...)
		if len(page) < deltaPage {
			return out
		}
	}
}
