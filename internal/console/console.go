// Package console is the operators' web console, served by the API under /console/: a page of
// plain HTML and a little JavaScript (embedded in the binary; nothing is fetched from elsewhere)
// over a small JSON API of its own under /console/api/.
//
// Operators are not tenants (package operator): the login exchanges an operator token for a
// session cookie (HttpOnly, SameSite=Strict, Secure over TLS), every state-changing request must
// carry the session's CSRF token in the X-CSRF-Token header and come from the console's own
// origin, and a tenant's bearer token opens nothing here. Every action is written to the audit
// log (package audit) with the operator's name and how many things it changed.
//
// Live figures reach the page over Server-Sent Events: the job page follows the job's
// transitions through the API's Postgres listener (LISTEN/NOTIFY), the overview is recomputed by
// the server every LiveInterval and sent when it changed. The page itself never polls.
package console

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/logthrottle"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/redisscript"
	"github.com/llmq/llmq/internal/tenant"
)

//go:embed static
var static embed.FS

// Credential is a configured credential, as the console shows it.
type Credential struct {
	Name     string
	Provider string
	// RequestsPerSecond and Burst are the configured request limit (zero: learned from the
	// provider).
	RequestsPerSecond float64
	Burst             int
}

// Config configures a Handler.
type Config struct {
	// Pool is the database of jobs, operators, tenants and the audit log. Required.
	Pool *pgxpool.Pool
	// Jobs is the job store. Required.
	Jobs *jobs.Store
	// Tasks requeues retried dead letters, aborts canceled jobs' tasks and reads the queue depth.
	// nil: retried jobs wait for the sweeper, a canceled job's attempt in flight stops at its
	// lease's next renewal, and the overview has no queue depth.
	Tasks *dispatch.Tasks
	// AfterCommit runs a cancel's abort and a retry's requeues once Postgres committed, waiting
	// at most a second and capping how many run at once (the API's, in its process). Default:
	// dispatch.NewAfterCommit(nil), of this Handler alone.
	AfterCommit *dispatch.AfterCommit
	// Redis holds the credentials' shared state (limiter, breaker). Required.
	Redis redis.UniversalClient
	// RedisPrefix starts llmq's own Redis keys. Default redisscript.DefaultPrefix.
	RedisPrefix string
	// Credentials are the configured credentials, in config order.
	Credentials []Credential
	// Canceled, when set, is told the credential of each job the console cancels (the API
	// counts it in llmq_jobs_finished_total, as its own cancels).
	Canceled func(credential string)
	// Listener follows job transitions for the job page. nil: the job page is re-read every
	// KeepAlive only (tests).
	Listener *jobs.Listener
	Logger   *slog.Logger
	// SessionTTL is how long a login lasts. Default 12h.
	SessionTTL time.Duration
	// LiveInterval is how often the overview's figures are recomputed while at least one
	// overview stream is open (once for all of them), at most: a recomputation that took d is
	// followed by the next after 20 × d at the least. Default 2s.
	LiveInterval time.Duration
	// KeepAlive is the interval of keep-alive comments on the event streams. Default 15s.
	KeepAlive time.Duration
	// EventWriteTimeout bounds the write of each event (and keep-alive) of an event stream: a
	// client that stops reading is cut off. Default 10s (the API's api.event_write_timeout).
	EventWriteTimeout time.Duration
	// RevokeSettle is how long after a tenant's revocation a revoke with cancel_jobs looks for
	// the tenant's jobs once more: the API replicas' Authenticator TTL, and a second for a submit
	// they accepted just before it ended to commit its job. Default tenant.DefaultCacheTTL + 1s.
	RevokeSettle time.Duration
	// ActionTimeout bounds the work in Postgres of each action (a POST: a cancel, a dead
	// letter's retry or purge, a tenant's change, a login): a statement Postgres has not answered
	// by then (a lock a long transaction holds, an I/O stall, a failover) is abandoned and the
	// action answered 503 unavailable, rather than waiting as long as the browser does with a
	// pool connection held. Reads and event streams are bounded by ReadTimeout. Default 10s (the
	// API gives it api.store_timeout).
	ActionTimeout time.Duration
	// ReadTimeout bounds the work in Postgres of each read: a page's GET (its session's lookup
	// included; the overview's counts over a large backlog), and each read of a job page's event
	// stream (its session's, its job's). A read Postgres has not answered by then (slow, or
	// silent: a partition, a failover behind a moved address) is abandoned and answered 503
	// unavailable (a stream's is tried again at its next wake-up), rather than leave the page
	// waiting as long as the browser does with a pool connection held. Default
	// DefaultReadTimeout (the API gives it two thirds of api.write_timeout, 20 s, at least
	// api.store_timeout: less than the write timeout, which would cut its 503).
	ReadTimeout time.Duration
	// OpenStream, when set, takes one of the process's event stream places for each live page
	// (the overview's, a job's) before it reads anything: the API's api.max_streams, which its
	// GET /v1/jobs/{id}/events takes too, so that live pages left open (by many operators, or a
	// script) hold no connection past the cap. ok false refuses the page 503 overloaded with
	// Retry-After retryAfter (the page opens its stream again a few seconds later); release
	// gives the place back, once. nil: the live pages are not capped (tests).
	OpenStream func() (release func(), retryAfter time.Duration, ok bool)
	// LookupWait bounds how long a login, or a request with a session cookie this process has
	// neither opened nor found live, waits for a place among the console's credential lookups
	// (a quarter of Pool's connections; see lookupGate): past it, it is answered 503 overloaded
	// with Retry-After. Default DefaultLookupWait.
	LookupWait time.Duration
	// Now is the clock of the overview's recomputations' durations, and of the throttle of the
	// refused logins' lines (LoginLogInterval). Default time.Now. The overview's window is on
	// Postgres's clock (jobs.Store.Stats).
	Now func() time.Time
}

// Handler serves /console/. It holds no per-request state; safe for concurrent use.
type Handler struct {
	cfg       Config
	operators *operator.Store
	tenants   *tenant.Store
	limiter   *limiter.Limiter
	breaker   *breaker.Breaker
	mux       *http.ServeMux
	// patterns are mux's routes ("METHOD path"), but the 405s and the catch-all 404 (routes).
	patterns []string
	// lookups caps the lookups of credentials anybody can make up (logins, new session cookies).
	lookups *lookupGate
	// live shares the overview's recomputation among its streams.
	live *liveOverview
	// loginLog throttles the lines of refused logins, by operator (LoginLogInterval).
	loginLog *logthrottle.Throttle
	// closing is closed by Shutdown to end the event streams.
	closing   chan struct{}
	closeOnce sync.Once
	// retryRand draws in [0, 1) the jitter of a refused live page's retry (refuseStream).
	retryRand func() float64
	// files are the page (index.html) and its scripts and style sheets, by name, read once.
	files map[string]pageFile
}

// DefaultReadTimeout is Config.ReadTimeout's default: far above what a page's reads take (the
// overview's counts over a backlog of millions included), which the API's api.store_timeout (10 s)
// is not always.
const DefaultReadTimeout = 30 * time.Second

// Prefix is the path the console is served under.
const Prefix = "/console/"

// New returns a Handler. Errors: a missing required field, or an invalid Redis prefix.
func New(cfg Config) (*Handler, error) {
	if cfg.Pool == nil || cfg.Jobs == nil || cfg.Redis == nil {
		return nil, fmt.Errorf("console: Pool, Jobs and Redis are required")
	}
	if cfg.RedisPrefix == "" {
		cfg.RedisPrefix = redisscript.DefaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.LiveInterval == 0 {
		cfg.LiveInterval = 2 * time.Second
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	if cfg.EventWriteTimeout == 0 {
		cfg.EventWriteTimeout = 10 * time.Second
	}
	if cfg.ActionTimeout <= 0 {
		cfg.ActionTimeout = 10 * time.Second
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.LookupWait <= 0 {
		cfg.LookupWait = DefaultLookupWait
	}
	if cfg.RevokeSettle == 0 {
		cfg.RevokeSettle = tenant.DefaultCacheTTL + time.Second
	}
	if cfg.AfterCommit == nil {
		cfg.AfterCommit = dispatch.NewAfterCommit(nil)
	}
	lim, err := limiter.New(cfg.Redis, &limiter.Config{Prefix: cfg.RedisPrefix})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	brk, err := breaker.New(cfg.Redis, &breaker.Config{Prefix: cfg.RedisPrefix})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	h := &Handler{cfg: cfg, operators: operator.NewStore(cfg.Pool, nil), tenants: tenant.NewStore(cfg.Pool, nil),
		limiter: lim, breaker: brk, mux: http.NewServeMux(), closing: make(chan struct{}), retryRand: rand.Float64,
		lookups: newLookupGate(int(cfg.Pool.Config().MaxConns)/4, cfg.LookupWait)}
	h.live = newLiveOverview(h)
	h.loginLog = logthrottle.New(&logthrottle.Config{Every: LoginLogInterval, Now: cfg.Now,
		Report: h.loginsSuppressed})
	if h.files, err = readPageFiles(static, "static"); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	h.routes()
	return h, nil
}

func (h *Handler) routes() {
	m := &routeMux{ServeMux: h.mux}
	m.HandleFunc("GET /console/{$}", func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		h.files["index.html"].serve(w, r)
	})
	m.Handle("GET /console/static/", http.StripPrefix("/console/static/", securityWrap(h.pageFiles())))
	m.HandleFunc("POST /console/api/login", h.timed(h.login))
	m.HandleFunc("POST /console/api/logout", h.timed(h.logout))
	m.HandleFunc("GET /console/api/session", h.read(h.authed(h.session)))
	m.HandleFunc("GET /console/api/overview", h.read(h.authed(h.overview)))
	m.HandleFunc("GET /console/api/overview/live", h.getOnly(h.liveAuthed(h.overviewLive)))
	m.HandleFunc("GET /console/api/jobs", h.read(h.authed(h.jobList)))
	m.HandleFunc("GET /console/api/jobs/{id}", h.read(h.authed(h.jobRoute(h.jobDetail))))
	m.HandleFunc("GET /console/api/jobs/{id}/live", h.getOnly(h.liveAuthed(h.jobRoute(h.jobLive))))
	m.HandleFunc("POST /console/api/jobs/{id}/cancel", h.timed(h.authed(h.jobRoute(h.jobCancel))))
	m.HandleFunc("GET /console/api/dead", h.read(h.authed(h.deadList)))
	m.HandleFunc("POST /console/api/dead/retry", h.timed(h.authed(h.deadRetry)))
	m.HandleFunc("POST /console/api/dead/purge", h.timed(h.authed(h.deadPurge)))
	m.HandleFunc("GET /console/api/credentials", h.read(h.authed(h.credentialList)))
	m.HandleFunc("POST /console/api/credentials/{name}/resume", h.timed(h.authed(h.credentialResume)))
	m.HandleFunc("GET /console/api/tenants", h.read(h.authed(h.tenantList)))
	m.HandleFunc("POST /console/api/tenants", h.timed(h.authed(h.tenantCreate)))
	m.HandleFunc("POST /console/api/tenants/{name}/revoke", h.timed(h.authed(h.tenantRevoke)))
	m.HandleFunc("POST /console/api/tenants/{name}/rotate", h.timed(h.authed(h.tenantRotate)))
	m.HandleFunc("POST /console/api/tenants/{name}/weight", h.timed(h.authed(h.tenantWeight)))
	m.HandleFunc("POST /console/api/tenants/{name}/delete", h.timed(h.authed(h.tenantDelete)))
	m.HandleFunc("GET /console/api/audit", h.read(h.authed(h.auditList)))
	h.patterns = m.patterns
	// A method a path does not serve is 405 with Allow, as the API answers (api/openapi.yaml),
	// not the catch-all's 404: each path's pattern without a method takes what its routes leave.
	allow := map[string][]string{}
	for _, p := range h.patterns {
		method, path, _ := strings.Cut(p, " ")
		allow[path] = append(allow[path], method)
	}
	for path, methods := range allow {
		if slices.Contains(methods, http.MethodGet) && !slices.Contains(streams, path) {
			methods = append(methods, http.MethodHead)
		}
		slices.Sort(methods)
		allowed := strings.Join(methods, ", ")
		h.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", allowed)
			writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusMethodNotAllowed, typ: "method_not_allowed", message: r.Method + " is not allowed on " + r.URL.Path})
		})
	}
	h.mux.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusNotFound, typ: "not_found", message: "no console route for " + r.Method + " " + r.URL.Path})
	})
}

// pageFiles serves the page's scripts and style sheets, the files of h.files by their names:
// anything else is the console's 404 not_found, as a path it does not have (the directory,
// index.html, which is the page at /console/, a path through a file or a directory).
func (h *Handler) pageFiles() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Path
		f, ok := h.files[name]
		if !ok || name == "index.html" {
			writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusNotFound, typ: "not_found", message: "no console file " + strconv.Quote(shorten(name))})
			return
		}
		f.serve(w, r)
	})
}

// pageFile is one of the files the console serves (its page, the page's scripts and style
// sheets), read once, with its ETag.
type pageFile struct {
	name    string
	content []byte
	// etag is a strong ETag of content (a hash of it): a release that changes the file changes
	// it, so that a browser's copy is never taken for the new one (see serve).
	etag string
}

// readPageFiles reads the files of the directory dir of fsys, by their names, each with its
// ETag. Errors: a file it cannot read (none, from the embedded files, unless the build broke).
func readPageFiles(fsys fs.FS, dir string) (map[string]pageFile, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read page files: %w", err)
	}
	files := map[string]pageFile{}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		content, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read page file %s: %w", e.Name(), err)
		}
		sum := sha256.Sum256(content)
		files[e.Name()] = pageFile{name: e.Name(), content: content, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
	}
	return files, nil
}

// serve answers r with the file: Cache-Control no-cache and its ETag, so that a browser keeps a
// copy but asks again on each load, and is answered 304 (no body) while its copy is the release's
// (If-None-Match), the file itself once a release changed it. Ranges, If-Match and If-Range are
// http.ServeContent's.
func (f pageFile) serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", f.etag)
	http.ServeContent(w, r, f.name, time.Time{}, bytes.NewReader(f.content))
}

// jobRoute runs next, a job route's handler, for a path whose {id} is a job ID (jobs.ValidID, in
// either case): another is 404 not_found saying that it is not one, before anything is read,
// rather than "no job with that id" as if there had been one.
func (h *Handler) jobRoute(next sessionHandler) sessionHandler {
	return func(w http.ResponseWriter, r *http.Request, s *operator.Session) {
		if id := r.PathValue("id"); !jobs.ValidID(id) {
			writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusNotFound, typ: "not_found", message: strconv.Quote(shorten(id)) + " is not a job ID: a job ID is a UUID (in either case)"})
			return
		}
		next(w, r, s)
	}
}

// shorten cuts a name from a request's path at 64 bytes, for a message that quotes it: at the
// start of a character (UTF-8), never inside one, whose half strconv.Quote would show as bytes
// (a name that is not UTF-8 is cut at 64 bytes, or at most 3 before).
func shorten(s string) string {
	const most = 64
	if len(s) <= most {
		return s
	}
	cut := most
	for cut > most-utf8.UTFMax+1 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// streams are the paths of the event streams, which refuse HEAD (getOnly); every other GET
// route serves it (ServeMux's rule).
var streams = []string{"/console/api/overview/live", "/console/api/jobs/{id}/live"}

// routeMux registers routes on a ServeMux and keeps their patterns ("METHOD path").
type routeMux struct {
	*http.ServeMux
	patterns []string
}

// Handle registers handler for pattern (http.ServeMux.Handle).
func (m *routeMux) Handle(pattern string, handler http.Handler) {
	m.ServeMux.Handle(pattern, handler)
	m.patterns = append(m.patterns, pattern)
}

// HandleFunc registers f for pattern (http.ServeMux.HandleFunc).
func (m *routeMux) HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(f))
}

// timed runs next, an action, with its context ending after ActionTimeout: a statement still
// waiting then is abandoned (pgx cancels it and closes its connection) and the action answered
// 503 unavailable (writeError). The audit entry and the requeue of retried jobs, written after
// the action's commit, do not depend on it (context.WithoutCancel).
func (h *Handler) timed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ActionTimeout)
		defer cancel()
		next(w, r.WithContext(ctx))
	}
}

// read runs next, a page's read, with its context ending after ReadTimeout: a statement still
// waiting then is abandoned (pgx cancels it and closes its connection) and the read answered 503
// unavailable (writeError).
func (h *Handler) read(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), h.cfg.ReadTimeout)
		defer cancel()
		next(w, r.WithContext(ctx))
	}
}

// readCtx is ctx bounded by ReadTimeout, for one read of an event stream, which no deadline on
// the request's context may bound.
func (h *Handler) readCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, h.cfg.ReadTimeout)
}

// getOnly refuses HEAD (405), which a "GET" pattern also matches, on an event stream: served as
// the GET, it is a body-less answer whose handler never ends, holding the connection.
func (h *Handler) getOnly(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusMethodNotAllowed, typ: "method_not_allowed", message: r.Method + " is not allowed on an event stream"})
			return
		}
		next(w, r)
	}
}

// openStream takes one of the process's event stream places for a live page (Config.OpenStream),
// after the session's check (a request without one takes none), or answers 503 overloaded with
// Retry-After: ok false, the answer written. Call release once when the stream ends.
func (h *Handler) openStream(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	if h.cfg.OpenStream == nil {
		return func() {}, true
	}
	release, retryAfter, ok := h.cfg.OpenStream()
	if !ok {
		secs := strconv.Itoa(max(1, int(retryAfter/time.Second)))
		w.Header().Set("Retry-After", secs)
		writeError(w, r, h.cfg.Logger, &apiError{status: http.StatusServiceUnavailable, typ: "overloaded", message: "this server has as many event streams open as it may (api.max_streams); retry after " + secs + " s"})
		return nil, false
	}
	return release, true
}

// Shutdown ends every open event stream of the console (the page's EventSource reconnects, to
// this replica or another), so that an HTTP server's shutdown does not wait for them, and stops
// the reports of the refused logins' lines held back (LoginLogInterval). It is idempotent and
// safe for concurrent use.
func (h *Handler) Shutdown() {
	h.closeOnce.Do(func() { close(h.closing) })
	h.loginLog.Stop()
}

// ServeHTTP implements http.Handler for every path under Prefix.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// securityHeaders forbids what the console never needs: framing (clickjacking), scripts or
// styles from anywhere but itself, and sniffing.
func securityHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("X-Frame-Options", "DENY")
}

func securityWrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		next.ServeHTTP(w, r)
	})
}
