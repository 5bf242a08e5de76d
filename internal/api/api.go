// Package api is llmq's HTTP API: submit, poll, stream (SSE) and cancel jobs, health, readiness
// and metrics. The routes and their JSON are a contract (DESIGN.md, api/openapi.yaml). Every error
// is {"error":{"type","message"}} with a fitting status, mapped in one place (writeError);
// internal details are logged, not returned.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/jobs"
)

// Config configures a Server.
type Config struct {
	Store     *jobs.Store
	Submitter *jobs.Submitter
	Pool      *pgxpool.Pool
	Redis     redis.UniversalClient
	// Gatherer serves /metrics. Default: an empty registry.
	Gatherer prometheus.Gatherer
	// AllowAnonymous maps requests without a bearer token to tenant "default".
	AllowAnonymous bool
	// MaxBodyBytes caps a submit body (413 above it). Default 4 MiB.
	MaxBodyBytes int64
	Logger       *slog.Logger
	// Listener signals job transitions to event streams. nil: streams only re-read the job's
	// events at every KeepAlive (tests; never in production).
	Listener *jobs.Listener
	// Tasks aborts the running attempt of a canceled job. nil: DELETE cancels in Postgres only
	// (the worker then skips the job, but an attempt in flight runs to its end).
	Tasks *jobs.Tasks
	// KeepAlive is the interval of the comment lines that keep an idle event stream open through
	// proxies; each also re-reads the job's events, a fallback should a notification be lost.
	// Default 15s.
	KeepAlive time.Duration
}

// Server serves the HTTP API. It holds no per-request state; run any number of replicas.
type Server struct {
	cfg    Config
	mux    *http.ServeMux
	routes []route
	// closing is closed by Shutdown to end the event streams.
	closing   chan struct{}
	closeOnce sync.Once
}

// route is one path and the handler of each method it answers.
type route struct {
	pattern string
	methods map[string]http.HandlerFunc
}

// New returns a Server.
func New(cfg Config) *Server {
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 4 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), closing: make(chan struct{})}
	metrics := promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})
	s.routes = []route{
		{"/v1/jobs", map[string]http.HandlerFunc{http.MethodPost: s.submit}},
		{"/v1/jobs/{id}", map[string]http.HandlerFunc{http.MethodGet: s.get, http.MethodDelete: s.cancel}},
		{"/v1/jobs/{id}/events", map[string]http.HandlerFunc{http.MethodGet: s.events}},
		{"/healthz", map[string]http.HandlerFunc{http.MethodGet: s.healthz}},
		{"/readyz", map[string]http.HandlerFunc{http.MethodGet: s.readyz}},
		{"/metrics", map[string]http.HandlerFunc{http.MethodGet: metrics.ServeHTTP}},
	}
	for _, rt := range s.routes {
		s.mux.HandleFunc(rt.pattern, s.methods(rt.methods))
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, s.cfg.Logger, &httpError{http.StatusNotFound, "not_found", "no route for " + r.Method + " " + r.URL.Path})
	})
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Shutdown ends every open event stream (their clients reconnect with Last-Event-ID, to this
// replica or another) and makes new ones end at once. Call it when the HTTP server shuts down
// (http.Server.RegisterOnShutdown), which otherwise waits for streams that never go idle. It is
// idempotent and safe for concurrent use.
func (s *Server) Shutdown() { s.closeOnce.Do(func() { close(s.closing) }) }

func (s *Server) methods(h map[string]http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if f, ok := h[r.Method]; ok {
			f(w, r)
			return
		}
		w.Header().Set("Allow", strings.Join(slices.Sorted(maps.Keys(h)), ", "))
		writeError(w, r, s.cfg.Logger, &httpError{http.StatusMethodNotAllowed, "method_not_allowed", r.Method + " is not allowed on " + r.URL.Path})
	}
}

// tenant returns the caller's tenant. Bearer tokens arrive with tenants (issue 6); until then
// only anonymous access exists, and only when allowed.
func (s *Server) tenant(r *http.Request) (string, error) {
	if r.Header.Get("Authorization") != "" {
		return "", &httpError{http.StatusUnauthorized, "unauthorized", "bearer tokens are not supported yet; use allow_anonymous for local use"}
	}
	if !s.cfg.AllowAnonymous {
		return "", &httpError{http.StatusUnauthorized, "unauthorized", "authentication required"}
	}
	return "default", nil
}

func (s *Server) submit(w http.ResponseWriter, r *http.Request) {
	tenant, err := s.tenant(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, r, s.cfg.Logger, &httpError{http.StatusRequestEntityTooLarge, "body_too_large", "body exceeds " + humanBytes(mbe.Limit)})
			return
		}
		writeError(w, r, s.cfg.Logger, &httpError{http.StatusBadRequest, "invalid_body", "could not read body: " + err.Error()})
		return
	}
	job, replayed, err := s.cfg.Submitter.Submit(r.Context(), tenant, r.Header.Get("Idempotency-Key"), body)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	w.Header().Set("Location", "/v1/jobs/"+job.ID)
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
		writeJSON(w, http.StatusOK, job)
		return
	}
	writeJSON(w, http.StatusAccepted, job)
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	job, err := s.job(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	writeJSON(w, http.StatusOK, job)
}

// job returns the job named by the path for the caller's tenant; another tenant's job is
// jobs.ErrNotFound, exactly like a missing one.
func (s *Server) job(r *http.Request) (*jobs.Job, error) {
	tenant, err := s.tenant(r)
	if err != nil {
		return nil, err
	}
	job, err := s.cfg.Store.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if job.Tenant != tenant {
		return nil, jobs.ErrNotFound
	}
	return job, nil
}

// cancel ends a job that has not ended: the transition in Postgres first (after it no result can
// be stored), then the abort of its task, wherever it runs.
func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	job, err := s.job(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	job, err = s.cfg.Store.Cancel(r.Context(), job.ID)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	if s.cfg.Tasks != nil {
		// The job is canceled whatever Redis says: the worker skips terminal jobs, so a failed
		// abort only lets an attempt already in flight run to its (unstored) end.
		if err := s.cfg.Tasks.Abort(job.ID); err != nil {
			s.cfg.Logger.WarnContext(r.Context(), "abort canceled job's task", "job_id", job.ID, "error", err)
		}
	}
	writeJSON(w, http.StatusOK, job)
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	checks := map[string]string{"postgres": "ok", "redis": "ok"}
	status := http.StatusOK
	if err := s.cfg.Pool.Ping(ctx); err != nil {
		checks["postgres"], status = "unreachable", http.StatusServiceUnavailable
	}
	if err := s.cfg.Redis.Ping(ctx).Err(); err != nil {
		checks["redis"], status = "unreachable", http.StatusServiceUnavailable
	}
	writeJSON(w, status, checks)
}

// httpError is an error with its HTTP answer.
type httpError struct {
	status  int
	typ     string
	message string
}

func (e *httpError) Error() string { return e.message }

// writeError is the one table from errors to HTTP statuses and machine codes.
func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	var he *httpError
	var inv *jobs.InvalidError
	var term *jobs.TerminalError
	switch {
	case errors.As(err, &he):
	case errors.As(err, &inv):
		he = &httpError{http.StatusBadRequest, inv.Type, inv.Message}
	case errors.As(err, &term):
		he = &httpError{http.StatusConflict, "job_terminal", term.Error()}
	case errors.Is(err, jobs.ErrNotFound):
		he = &httpError{http.StatusNotFound, "not_found", "no job with that id"}
	case errors.Is(err, jobs.ErrIdempotencyKeyReused):
		he = &httpError{http.StatusUnprocessableEntity, "idempotency_key_reused", "this Idempotency-Key was used with a different request body"}
	case errors.Is(err, context.Canceled):
		return // the client left
	case jobs.IsUnavailable(err):
		w.Header().Set("Retry-After", "5")
		logger.WarnContext(r.Context(), "store unavailable", "method", r.Method, "path", r.URL.Path, "error", err)
		he = &httpError{http.StatusServiceUnavailable, "unavailable", "the job store is unreachable; retry shortly"}
	default:
		logger.ErrorContext(r.Context(), "internal error", "method", r.Method, "path", r.URL.Path, "error", err)
		he = &httpError{http.StatusInternalServerError, "internal", "internal error"}
	}
	writeJSON(w, he.status, map[string]any{"error": map[string]string{"type": he.typ, "message": he.message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return itoa(n>>20) + " MiB"
	case n >= 1<<10 && n%(1<<10) == 0:
		return itoa(n>>10) + " KiB"
	}
	return itoa(n) + " bytes"
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
