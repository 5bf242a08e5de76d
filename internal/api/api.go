// Package api is llmq's HTTP API: submit and poll jobs, health, readiness and metrics. The routes
// and their JSON are a contract (DESIGN.md). Every error is {"error":{"type","message"}} with a
// fitting status, mapped in one place (writeError); internal details are logged, not returned.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
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
}

// Server serves the HTTP API. It holds no per-request state; run any number of replicas.
type Server struct {
	cfg Config
	mux *http.ServeMux
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
	s := &Server{cfg: cfg, mux: http.NewServeMux()}
	s.mux.HandleFunc("/v1/jobs", s.methods(map[string]http.HandlerFunc{http.MethodPost: s.submit}))
	s.mux.HandleFunc("/v1/jobs/{id}", s.methods(map[string]http.HandlerFunc{http.MethodGet: s.get}))
	s.mux.HandleFunc("/healthz", s.methods(map[string]http.HandlerFunc{http.MethodGet: s.healthz}))
	s.mux.HandleFunc("/readyz", s.methods(map[string]http.HandlerFunc{http.MethodGet: s.readyz}))
	s.mux.Handle("/metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, s.cfg.Logger, &httpError{http.StatusNotFound, "not_found", "no route for " + r.Method + " " + r.URL.Path})
	})
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

func (s *Server) methods(h map[string]http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if f, ok := h[r.Method]; ok {
			f(w, r)
			return
		}
		allowed := make([]string, 0, len(h))
		for m := range h {
			allowed = append(allowed, m)
		}
		w.Header().Set("Allow", strings.Join(allowed, ", "))
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
	tenant, err := s.tenant(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	job, err := s.cfg.Store.Get(r.Context(), r.PathValue("id"))
	if err == nil && job.Tenant != tenant {
		err = jobs.ErrNotFound
	}
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
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
	switch {
	case errors.As(err, &he):
	case errors.As(err, &inv):
		he = &httpError{http.StatusBadRequest, inv.Type, inv.Message}
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
