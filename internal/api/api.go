// Package api is llmq's HTTP API: submit, poll, stream (SSE) and cancel jobs, health, readiness
// and metrics. The routes and their JSON are a contract (api/openapi.yaml). Every error
// is {"error":{"type","message"}} with a fitting status, mapped in one place (writeError);
// internal details are logged, not returned.
package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/logthrottle"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/pgwait"
	"github.com/llmq/llmq/internal/tenant"
)

// Config configures a Server.
type Config struct {
	Store *jobs.Store
	// Submit is the submit contract's defaults and limits (the configured credentials, ...).
	Submit SubmitConfig
	// Enqueuer hands a new job to the workers. nil: jobs are only committed (the sweeper enqueues
	// them; tests).
	Enqueuer *dispatch.Enqueuer
	// Handoff, when set, runs a new job's first delivery in this process instead (llmq serve):
	// a submit claims a slot of it and the first attempt's admission before the job's insert,
	// which then starts the attempt too when the admission allows. A job it declines is
	// enqueued.
	Handoff *dispatch.Handoff
	// Metrics, when set, counts submits.
	Metrics *Metrics
	Pool    *pgxpool.Pool
	Redis   redis.UniversalClient
	// Gatherer serves /metrics. Default: an empty registry.
	Gatherer prometheus.Gatherer
	// AllowAnonymous maps requests without an Authorization header to tenant "default", as
	// Tenants has it stored (its credentials, its revocation), when it does. A request with one is
	// authenticated whatever this says.
	AllowAnonymous bool
	// Tenants resolves bearer tokens to tenants. nil: no token is accepted (a request with an
	// Authorization header is 401), which leaves only anonymous access. Its lookups of tokens it
	// never knew hold a share of the pool (tenant.AuthenticatorConfig.MaxNewTokenLookups); one
	// that finds no place within StoreWait is answered 503 overloaded.
	Tenants *tenant.Authenticator
	// SubmitRate limits each tenant's submits (429 with Retry-After above it). nil: unlimited.
	SubmitRate *tenant.RateLimiter
	// MaxBodyBytes caps a submit body (413 above it). Default 4 MiB.
	MaxBodyBytes int64
	// MaxBodyBytesInFlight caps the bytes of the submit bodies this replica reads at once, each
	// counted at its Content-Length (MaxBodyBytes without one) until its request ends; a submit
	// above it is answered 503 (type overloaded, with Retry-After). One tenant holds at most half
	// of it (at least MaxBodyBytes). Default 64 × MaxBodyBytes; less than MaxBodyBytes is taken
	// as MaxBodyBytes. The results of the jobs polls answer at once have a budget of the same
	// size (see Server.answerBytes).
	MaxBodyBytesInFlight int64
	Logger               *slog.Logger
	// Listener signals job transitions to event streams. nil: streams only re-read the job's
	// events at every KeepAlive (tests; never in production).
	Listener *jobs.Listener
	// Tasks aborts the running attempt of a canceled job. nil: DELETE cancels in Postgres only
	// (the worker then skips the job, but an attempt in flight runs to its end).
	Tasks *dispatch.Tasks
	// AfterCommit runs a submit's enqueue and a cancel's abort once Postgres committed, waiting
	// at most a second and capping how many run at once (the console shares it). Default:
	// dispatch.NewAfterCommit(nil), of this Server alone.
	AfterCommit *dispatch.AfterCommit
	// KeepAlive is the interval of the comment lines that keep an idle event stream open through
	// proxies; each also renews the stream's watch of the job, and reads the job's events when
	// the watch finds one the stream has not read (a fallback should a notification be lost),
	// and a streaming job's delta buffer. A stream's first comes at a random point of
	// [KeepAlive/2, KeepAlive) after it opened, the later ones every KeepAlive: streams opened
	// together (a reconnect storm) keep their keep-alives, and their renewals, apart. Default 15s.
	KeepAlive time.Duration
	// StreamSigner signs the events_url of every job answered, and checks the token of such a
	// URL. nil: jobs carry no events_url and event streams need a bearer token.
	StreamSigner *StreamSigner
	// EventWriteTimeout bounds the write of each event (and keep-alive) of a stream, each
	// 16 KiB of a larger one apart (a slow but steady reader gets it whole): a client that stops
	// reading is cut off, and the stream's memory freed. Default 10s.
	EventWriteTimeout time.Duration
	// MaxStreamsPerTenant caps each tenant's open event streams on this replica (429 with
	// Retry-After above it). Default 100.
	MaxStreamsPerTenant int
	// MaxKeyedSubmitsPerTenant caps each tenant's submits with an Idempotency-Key and cancels,
	// together, in their Postgres stage on this replica (each holds a pool connection of its own
	// for its transaction; see tenantGate): one over it waits up to StoreWait for one of them to
	// end, then is answered 429 too_many_submits (a submit) or too_many_cancels (a cancel) with
	// Retry-After. Default: half of Pool's connections (at least 1), 8 without a Pool, so that
	// one tenant's flood of them leaves the other half to the others.
	MaxKeyedSubmitsPerTenant int
	// MaxStreams caps the event streams open on this replica, every tenant's together (503
	// overloaded with Retry-After above it, before the stream reads anything). Default half of
	// httpserve.DefaultMaxConnections (FromConfig: half of api.max_connections), so that streams
	// leave connections to every other request.
	MaxStreams int
	// StoreWait bounds how long a submit, a poll or a cancel waits for a free Postgres
	// connection of the pool (each time it needs one; the pool must carry pgwait.Tracer): past
	// it the request is answered 503 overloaded with Retry-After, having sent nothing to
	// Postgres. It bounds the event streams' shared reads of a job too, from the read's turn
	// (statusReads: a quarter of the pool's connections read at once, the other reads wait
	// their turn; past the bound the streams the read serves end, and resume with
	// Last-Event-ID), and their watch renewals, from theirs (as many again). Default 5s.
	StoreWait time.Duration
	// StoreTimeout bounds the whole of a submit's, a poll's or a cancel's work in Postgres (its
	// waits for a connection and its statements): a request Postgres has not answered by then
	// (a statement waiting for a lock a long transaction holds, an I/O stall, a failover) is
	// answered 503 unavailable with Retry-After, its statement abandoned and its connection
	// closed, rather than waiting as long as its client does (a cancel) or past the server's
	// write timeout, which cuts the connection without an answer (a submit, a poll). A submit
	// body's arrival is not counted (the server's read timeout bounds it). Keep it below the
	// server's write timeout. It bounds the event streams' shared reads of a job too
	// (statusReads). Default DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Now is the clock of throttled log lines and of the submit stages' metric. Default time.Now.
	Now func() time.Time
	// Deltas reads the delta buffers of streaming jobs for their event streams. nil: event
	// streams carry status events only.
	Deltas *deltastream.Buffer
	// DeltaHub wakes event streams when their job's buffer grows. nil: streams read the buffer
	// at status changes and keep-alives only (tests).
	DeltaHub *deltastream.Hub
	// writeNow is the clock of the event streams' write deadlines (tests). Default time.Now.
	writeNow func() time.Time
	// retryRand draws in [0, 1) the jitter of the retry field that tells a refused EventSource
	// when to come back (refuseStream; tests). Default rand.Float64.
	retryRand func() float64
	// keepAliveTicks, when set, is each event stream's keep-alive tick (tests) instead of a
	// ticker of KeepAlive.
	keepAliveTicks <-chan time.Time
	// keepAliveRand draws in [0, 1) where a stream's first keep-alive falls in [KeepAlive/2,
	// KeepAlive) (firstKeepAlive; tests). Default rand.Float64.
	keepAliveRand func() float64
	// newTicker starts a stream's keep-alive ticker, ticking every d (tests). Default
	// time.NewTicker's.
	newTicker func(d time.Duration) (<-chan time.Time, ticker)
	// Console, when set, serves everything under /console/ (the operators' console). Shutdown
	// calls its Shutdown method, when it has one.
	Console http.Handler
}

// Server serves the HTTP API. It holds no per-request state; run any number of replicas.
type Server struct {
	cfg      Config
	contract *contract
	mux      *http.ServeMux
	routes   []route
	// notFound answers an unknown path (route "/" of the metrics).
	notFound http.Handler
	// streams counts each tenant's open event streams.
	streams *streamCounter
	// reads shares the reads of a job's status events among its streams.
	reads *statusReads
	// authLog throttles the log lines of refused credentials.
	authLog *logthrottle.Throttle
	// bodies bounds the submit bodies read at once (MaxBodyBytesInFlight).
	bodies *bodyBudget
	// answerBytes bounds the results of the jobs that polls answer at once, each held from its
	// read until its answer is written (a client that does not read it holds it up to the write
	// timeout): of the same size as bodies, one tenant at most half of it.
	answerBytes *bodyBudget
	// keyed caps each tenant's keyed submits and cancels in their Postgres stage, together
	// (MaxKeyedSubmitsPerTenant).
	keyed *tenantGate
	// refusalLog throttles the log lines of tenants refused over their share, by tenant and type.
	refusalLog *logthrottle.Throttle
	// streamLog throttles the log lines of the event streams' failures, by message (streamWarn,
	// refuseStream).
	streamLog *logthrottle.Throttle
	// closing is closed by Shutdown to end the event streams.
	closing   chan struct{}
	closeOnce sync.Once
	// draining is set by Drain: /readyz answers 503 while the server still serves.
	draining atomic.Bool
	// ownProbe holds the one connection of /readyz's own (postgresAnswers) at a time.
	ownProbe chan struct{}
	// ownRedisProbe holds the one Redis connection of /readyz's own (redisAnswers) at a time.
	ownRedisProbe chan struct{}
	// answers holds writeJob's buffers, each a *[]byte (empty: writeJob makes one): a submit's
	// and a poll's answer were a buffer of their own each.
	answers sync.Pool
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
	if cfg.MaxBodyBytesInFlight == 0 {
		cfg.MaxBodyBytesInFlight = 64 * cfg.MaxBodyBytes
	}
	cfg.MaxBodyBytesInFlight = max(cfg.MaxBodyBytesInFlight, cfg.MaxBodyBytes)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.NewRegistry()
	}
	if cfg.AfterCommit == nil {
		cfg.AfterCommit = dispatch.NewAfterCommit(nil)
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	if cfg.EventWriteTimeout == 0 {
		cfg.EventWriteTimeout = 10 * time.Second
	}
	if cfg.MaxStreamsPerTenant == 0 {
		cfg.MaxStreamsPerTenant = 100
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = defaultMaxStreams(0)
	}
	if cfg.StoreWait == 0 {
		cfg.StoreWait = 5 * time.Second
	}
	if cfg.MaxKeyedSubmitsPerTenant == 0 {
		cfg.MaxKeyedSubmitsPerTenant = 8
		if cfg.Pool != nil {
			cfg.MaxKeyedSubmitsPerTenant = max(1, poolConns(cfg.Pool)/2)
		}
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = DefaultStoreTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.writeNow == nil {
		cfg.writeNow = time.Now
	}
	if cfg.retryRand == nil {
		cfg.retryRand = rand.Float64
	}
	if cfg.keepAliveRand == nil {
		cfg.keepAliveRand = rand.Float64
	}
	if cfg.newTicker == nil {
		cfg.newTicker = newTimeTicker
	}
	s := &Server{cfg: cfg, contract: newContract(cfg.Submit), mux: http.NewServeMux(), closing: make(chan struct{}), ownProbe: make(chan struct{}, 1), ownRedisProbe: make(chan struct{}, 1),
		streams: newStreamCounter(cfg.MaxStreams, cfg.MaxStreamsPerTenant, cfg.Metrics), reads: newStatusReads(cfg.Store, statusReadTurns(poolConns(cfg.Pool)), cfg.StoreWait, cfg.StoreTimeout, cfg.KeepAlive, cfg.Now, cfg.Metrics),
		bodies: newBodyBudget(cfg.MaxBodyBytesInFlight, cfg.MaxBodyBytes), answerBytes: newBodyBudget(cfg.MaxBodyBytesInFlight, cfg.MaxBodyBytes), keyed: newTenantGate(cfg.MaxKeyedSubmitsPerTenant)}
	s.streamLog = logthrottle.New(&logthrottle.Config{Every: streamLogInterval, Now: cfg.Now,
		Report: s.streamsSuppressed})
	s.authLog = logthrottle.New(&logthrottle.Config{Every: authLogInterval, Now: cfg.Now,
		Report: s.authSuppressed})
	s.refusalLog = logthrottle.New(&logthrottle.Config{Every: authLogInterval, Now: cfg.Now,
		Report: s.refusalsSuppressed})
	cfg.Metrics.initCredentials(cfg.Submit.Credentials)
	metrics := promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{})
	// HEAD answers as GET (net/http drops the body a handler writes to it), as RFC 9110 asks of
	// every path that serves GET; but not the event stream, which never ends.
	s.routes = []route{
		// A submit bounds its store work itself, apart from its body's arrival (see submit).
		{"/v1/jobs", map[string]http.HandlerFunc{http.MethodPost: s.submit}},
		{"/v1/jobs/{id}", map[string]http.HandlerFunc{http.MethodGet: s.polled(s.get), http.MethodHead: s.polled(s.get), http.MethodDelete: s.polled(s.cancel)}},
		{"/v1/jobs/{id}/events", map[string]http.HandlerFunc{http.MethodGet: s.events, http.MethodOptions: eventsPreflight}},
		{"/healthz", map[string]http.HandlerFunc{http.MethodGet: s.healthz, http.MethodHead: s.healthz}},
		{"/readyz", map[string]http.HandlerFunc{http.MethodGet: s.readyz, http.MethodHead: s.readyz}},
		{"/metrics", map[string]http.HandlerFunc{http.MethodGet: metrics.ServeHTTP, http.MethodHead: metrics.ServeHTTP}},
	}
	for _, rt := range s.routes {
		s.mux.Handle(rt.pattern, cfg.Metrics.instrument(rt.pattern, s.methods(rt.methods), cfg.Logger))
	}
	if cfg.Console != nil {
		s.mux.Handle("/console/", cfg.Metrics.instrument("/console/", cfg.Console, cfg.Logger))
	}
	s.notFound = cfg.Metrics.instrument("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		message := "no route for " + r.Method + " " + r.URL.Path
		if clean := cleanPath(r.URL.EscapedPath()); clean != r.URL.EscapedPath() {
			message += " (paths are matched as written: did you mean " + clean + "?)"
		}
		writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusNotFound, typ: "not_found", message: message})
	}), cfg.Logger)
	s.mux.Handle("/", s.notFound)
	return s
}

// ServeHTTP implements http.Handler. A path with an empty or a dot segment ("//v1/jobs",
// "/v1/jobs/x/../y") is an unknown path, answered 404 like any other: ServeMux would redirect it
// to its cleaned form, an answer the contract does not describe, whose Location drops the path
// prefix of a proxy in front and which makes a client re-send a submit to another URL.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p := r.URL.EscapedPath(); r.Method != http.MethodConnect && cleanPath(p) != p {
		s.notFound.ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// cleanPath is p in the form ServeMux routes without a redirect (its own cleanPath): rooted,
// without empty or dot segments, a trailing slash kept.
func cleanPath(p string) string {
	if p == "" || p[0] != '/' {
		p = "/" + p
	}
	clean := path.Clean(p)
	if strings.HasSuffix(p, "/") && clean != "/" {
		clean += "/"
	}
	return clean
}

// Drain makes /readyz answer 503 ("shutdown": "draining") from now on, the stores answering or
// not, while every other route goes on serving: a stopping process calls it at its signal, so
// that its load balancer takes it out of service before it stops listening (api.drain_delay).
// It is safe for concurrent use.
func (s *Server) Drain() { s.draining.Store(true) }

// Shutdown ends every open event stream (their clients reconnect with Last-Event-ID, to this
// replica or another) and makes new ones end at once. Call it when the HTTP server shuts down
// (http.Server.RegisterOnShutdown), which otherwise waits for streams that never go idle. It is
// idempotent and safe for concurrent use.
func (s *Server) Shutdown() {
	s.closeOnce.Do(func() { close(s.closing) })
	s.streamLog.Stop()
	s.authLog.Stop()
	s.refusalLog.Stop()
	if c, ok := s.cfg.Console.(interface{ Shutdown() }); ok {
		c.Shutdown()
	}
}

func (s *Server) methods(h map[string]http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if f, ok := h[r.Method]; ok {
			f(w, r)
			return
		}
		w.Header().Set("Allow", strings.Join(slices.Sorted(maps.Keys(h)), ", "))
		writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusMethodNotAllowed, typ: "method_not_allowed", message: r.Method + " is not allowed on " + r.URL.Path})
	}
}

// poolConns is pool's most connections (pool_max_conns), 0 without a pool.
func poolConns(pool *pgxpool.Pool) int {
	if pool == nil {
		return 0
	}
	return int(pool.Config().MaxConns)
}

// DefaultStoreTimeout is Config.StoreTimeout's default: a third of the server's default write
// timeout (30 s), so that the 503 reaches the client, and twice the wait for a connection
// (StoreWait, 5 s).
const DefaultStoreTimeout = 10 * time.Second

// errStoreTimeout is the cause of a request's context ended by StoreTimeout.
var errStoreTimeout = errors.New("the job store did not answer in time")

// polled runs h, a poll or a cancel, with the bounds of storeBounded: each wait for a pool
// connection at most StoreWait, its whole work at most StoreTimeout.
func (s *Server) polled(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r, stop := s.storeBounded(r)
		defer stop()
		h(w, r)
	}
}

// storeBounded returns r with the bounds of a poll's work in Postgres (polled): each wait for a
// pool connection (or a place among the lookups of new tokens) lasting at most StoreWait
// (pgwait.Bound: past it, r's context is canceled, nothing having been sent), the whole at most
// StoreTimeout, answered 503 overloaded and 503 unavailable (writeError, given the returned
// request). It is for a poll's or a cancel's work, a submit's lookup of its caller, and an event
// stream's in Postgres outside its shared reads (a lookup of its caller, its reads before its
// headers, the checks of its token), whose stream is not bounded so: it waits for its client
// anyway, and a stream cut by a busy pool would only come back at once. Call stop once that work
// is done. One copy of r carries both bounds.
func (s *Server) storeBounded(r *http.Request) (_ *http.Request, stop context.CancelFunc) {
	return s.storeBoundedFor(r, s.cfg.StoreTimeout)
}

// storeBoundedFor is storeBounded with d for the whole (a submit's commit: what its caller's
// lookup left of StoreTimeout). The bound on the waits for a connection is StoreWait still.
func (s *Server) storeBoundedFor(r *http.Request, d time.Duration) (_ *http.Request, stop context.CancelFunc) {
	ctx, stop := context.WithTimeoutCause(r.Context(), d, errStoreTimeout)
	// The bound's context is a child of stop's, which ends it: its own cancel would only add
	// a closure joining the two. Its end is the bound's cause, or the deadline's.
	ctx, _ = pgwait.Bound(ctx, s.cfg.StoreWait)
	return r.WithContext(ctx), stop
}

// authenticated authenticates r's caller (tenant). An answer at hand (cachedTenant: most
// requests, whose token was looked up within the Authenticator's TTL) is taken as it is; only a
// lookup is bounded (storeBounded), and spent is the time it took (zero without one: a submit
// counts it in its StoreTimeout). A bound made for an answer at hand would bound no wait: its
// contexts, timer and cancel, and the request's copy, were 5 allocations a submit and more an
// event stream's opening (TestServer_SubmitTenantAllocs, TestServer_StreamCallerAllocs). A
// failure is answered by refuse, given the request the answer came with (r, or storeBounded's:
// writeError reads why its context ended) before the bound ends; ok is then false.
func (s *Server) authenticated(r *http.Request, refuse func(*http.Request, error)) (_ *tenant.Tenant, spent time.Duration, ok bool) {
	tn, err := s.cachedTenant(r)
	if errors.Is(err, tenant.ErrNotCached) {
		start := time.Now()
		ar, stop := s.storeBounded(r)
		defer stop() // after the answer: writeError reads why ar's context ended
		tn, err = s.tenant(ar)
		spent = time.Since(start)
		r = ar
	}
	if err != nil {
		refuse(r, err)
		return nil, spent, false
	}
	return tn, spent, true
}

// tenant authenticates the caller. Without an Authorization header it is tenant "default" when
// anonymous access is allowed (as stored, when the operator created it: its credentials apply,
// and it is 403 once revoked), else 401. With one, it must be exactly "Bearer <token>" with a
// known token: 401 otherwise (a token a rotation replaced, once the overlap has ended, included),
// 403 when the token's tenant was revoked. The token itself never reaches a log or an error
// message.
func (s *Server) tenant(r *http.Request) (*tenant.Tenant, error) { return s.identify(r, false) }

// cachedTenant is tenant's answer when it needs no lookup (the header's own refusals, a token's
// or the anonymous tenant's answer fresh in the Authenticator's cache: tenant.Authenticator's
// Cached and CachedNamed), else tenant.ErrNotCached, having logged and counted nothing: tenant
// then looks the caller up.
func (s *Server) cachedTenant(r *http.Request) (*tenant.Tenant, error) { return s.identify(r, true) }

// identify is tenant, its lookups answered from the Authenticator's cache alone when cachedOnly
// (cachedTenant).
func (s *Server) identify(r *http.Request, cachedOnly bool) (*tenant.Tenant, error) {
	values, present := r.Header["Authorization"]
	if !present {
		if !s.cfg.AllowAnonymous {
			return nil, unauthorized("", "authentication required: send Authorization: Bearer <token>")
		}
		if s.cfg.Tenants == nil {
			return &tenant.Tenant{Name: tenant.Default, Weight: tenant.DefaultWeight}, nil
		}
		// The operator may have stored tenant "default" (its credentials, a revocation): an
		// anonymous request is that tenant, as a request with its token is.
		var t *tenant.Tenant
		var err error
		if cachedOnly {
			t, err = s.cfg.Tenants.CachedNamed(tenant.Default)
		} else {
			t, err = s.cfg.Tenants.Named(r.Context(), tenant.Default)
		}
		if errors.Is(err, tenant.ErrRevoked) {
			return nil, &httpError{status: http.StatusForbidden, typ: "tenant_revoked",
				message: "tenant \"default\", which requests without a token act as, was revoked"}
		}
		return t, err
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	if len(values) != 1 || !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return nil, unauthorized("invalid_request", "malformed Authorization header: want \"Bearer <token>\"")
	}
	if s.cfg.Tenants == nil {
		return nil, unauthorized("invalid_token", "this server accepts no bearer tokens")
	}
	var t *tenant.Tenant
	var err error
	if cachedOnly {
		t, err = s.cfg.Tenants.Cached(strings.TrimSpace(token))
	} else {
		t, err = s.cfg.Tenants.Authenticate(r.Context(), strings.TrimSpace(token))
	}
	switch {
	case err == nil:
		return t, nil
	case errors.Is(err, tenant.ErrMalformedBearerToken):
		// What is wrong, never the token: a copy that lost or gained a character (quotes, a
		// line break), or the console's operator token, is told apart from an unknown one.
		if strings.HasPrefix(strings.TrimSpace(token), operator.TokenPrefix) {
			return nil, unauthorized("invalid_token", "invalid bearer token: that is an operator's token, for the console; the API takes a tenant's (ctl tenants create)")
		}
		return nil, unauthorized("invalid_token", fmt.Sprintf("malformed bearer token: an llmq token is %s followed by 43 letters, digits, '-' or '_'", tenant.BearerTokenPrefix))
	case errors.Is(err, tenant.ErrUnknownBearerToken):
		return nil, unauthorized("invalid_token", "unknown bearer token: no tenant has it")
	case errors.Is(err, tenant.ErrRotatedOut):
		// Once a minute per tenant, as below: the log tells the operator which tenant still has
		// a client on its old token.
		if t != nil {
			if log, suppressed := s.authLog.Allow(authLogKey(msgRotatedOut, t.Name)); log {
				s.cfg.Logger.WarnContext(r.Context(), msgRotatedOut, "tenant", t.Name,
					"method", r.Method, "path", r.URL.Path, "suppressed", suppressed)
			}
		}
		return nil, unauthorized("invalid_token", "rotated-out bearer token: its tenant's token was rotated and the overlap of the old one has ended; use the new token")
	case errors.Is(err, tenant.ErrRevoked):
		return nil, s.revokedTenant(r, t, "this bearer token was revoked")
	case errors.Is(err, tenant.ErrNewTokenLookupsFull):
		// Answered 503 overloaded (writeError) as a full pool is, but with room in the pool: a
		// client sending made-up tokens, most likely. Counted, and logged once a minute: no
		// tenant to name, and the flood must not flood the log.
		s.cfg.Metrics.refusedTokenLookup()
		if log, suppressed := s.refusalLog.Allow(newTokenLookupsLogKey); log {
			s.cfg.Logger.WarnContext(r.Context(), msgNewTokenLookupsRefused,
				"method", r.Method, "path", r.URL.Path, "suppressed", suppressed)
		}
		return nil, err
	default:
		return nil, err
	}
}

// revokedTenant is the answer to a request whose token (a bearer token, or a signed events_url)
// is revoked tenant t's: 403 token_revoked with message. It is logged once a minute per tenant:
// a client that keeps using a revoked token must not flood the log (the count of those left out
// goes with the next line, or a line of their own once the minute has passed: authSuppressed).
func (s *Server) revokedTenant(r *http.Request, t *tenant.Tenant, message string) *httpError {
	if t != nil {
		if log, suppressed := s.authLog.Allow(authLogKey(msgRevoked, t.Name)); log {
			s.cfg.Logger.WarnContext(r.Context(), msgRevoked, "tenant", t.Name,
				"method", r.Method, "path", r.URL.Path, "suppressed", suppressed)
		}
	}
	return &httpError{status: http.StatusForbidden, typ: "token_revoked", message: message}
}

// newTokenLookupsLogKey is the refusal log's key of the lookups of new bearer tokens refused: no
// tenant's (their keys start with a name, which holds no NUL).
const newTokenLookupsLogKey = "\x00new token lookups"

// The messages of the throttled lines of refused credentials and refusals (authLog, refusalLog),
// which their trailing reports repeat.
const (
	msgRotatedOut             = "request with a tenant's rotated-out token"
	msgRevoked                = "request with a revoked tenant's token"
	msgNewTokenLookupsRefused = "lookups of bearer tokens never known hold their share of the pool; refused"
	msgOverShare              = "tenant over its share; refused"
)

// authLogKey is the auth log's key of tenant's lines of message msg: each message of a tenant
// is throttled, and reported, apart.
func authLogKey(msg, tenant string) string { return msg + "\x00" + tenant }

// authSuppressed logs the lines of refused credentials that the auth log held back and no line
// of their key counted since (authLog's Report): the last minute of a client that then stopped.
func (s *Server) authSuppressed(key string, _ slog.Level, suppressed int, _ []any) {
	msg, tenant, _ := strings.Cut(key, "\x00")
	s.cfg.Logger.Warn(msg, "tenant", tenant, "suppressed", suppressed)
}

// refusalsSuppressed logs the refusals that the refusal log held back and no line of their key
// counted since (refusalLog's Report), with their message, and their tenant and type when a
// tenant's (the requests held back may have been anonymous or not: not said).
func (s *Server) refusalsSuppressed(key string, _ slog.Level, suppressed int, _ []any) {
	if key == newTokenLookupsLogKey {
		s.cfg.Logger.Warn(msgNewTokenLookupsRefused, "suppressed", suppressed)
		return
	}
	tenant, typ, _ := strings.Cut(key, "\x00")
	s.cfg.Logger.Warn(msgOverShare, "tenant", tenant, "type", typ, "suppressed", suppressed)
}

// unauthorized is a 401 with the WWW-Authenticate challenge of RFC 6750; code is its error
// attribute ("" when no token was sent).
func unauthorized(code, message string) *httpError {
	challenge := `Bearer realm="llmq"`
	if code != "" {
		challenge += `, error="` + code + `"`
	}
	return &httpError{status: http.StatusUnauthorized, typ: "unauthorized", message: message,
		header: http.Header{"Www-Authenticate": {challenge}}}
}

// admit applies the tenant's submit rate: a 429 with Retry-After above it. When Redis cannot
// answer the request is admitted (and the failure logged): the limit protects fairness, and
// submitting needs only Postgres.
func (s *Server) admit(r *http.Request, tenantName string) error {
	if s.cfg.SubmitRate == nil {
		return nil
	}
	// Bounded: an unreachable Redis must not hold every submit for the client's dial timeout.
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	d, err := s.cfg.SubmitRate.Allow(ctx, tenantName)
	if err != nil {
		if r.Context().Err() == nil {
			s.cfg.Logger.WarnContext(r.Context(), "tenant submit rate unavailable; admitting", "tenant", tenantName, "error", err)
		}
		return nil
	}
	if d.Allowed {
		return nil
	}
	secs := d.RetryAfterSeconds()
	return &httpError{status: http.StatusTooManyRequests, typ: "rate_limited",
		message: fmt.Sprintf("tenant %q is over its submit rate; retry after %d s", tenantName, secs),
		header:  http.Header{"Retry-After": {strconv.Itoa(secs)}}}
}

// overShare counts and logs refusal, a 429 that refuses tenant for its own excess (its submit
// rate, its share of the bodies being read, of the keyed submits, of the cancels or of the event
// streams), and returns it. The count (llmq_http_tenant_refusals_total) names the tenant only
// when the request authenticated as it (a bearer token, or a signed events_url): an anonymous
// request's is counted under tenant "", so that the label's values stay the operator's tenants.
// The log line (once a minute per tenant and type: a flooding client must not flood the log)
// names the tenant always.
func (s *Server) overShare(r *http.Request, tenant string, authenticated bool, refusal *httpError) *httpError {
	label := ""
	if authenticated {
		label = tenant
	}
	s.cfg.Metrics.refusedOverShare(label, refusal.typ)
	if log, suppressed := s.refusalLog.Allow(tenant + "\x00" + refusal.typ); log {
		s.cfg.Logger.WarnContext(r.Context(), msgOverShare, "tenant", tenant, "anonymous", !authenticated,
			"type", refusal.typ, "method", r.Method, "path", r.URL.Path, "suppressed", suppressed)
	}
	return refusal
}

// takeBudget takes n bytes of budget for tenant, or answers r with why not and returns false:
// over the tenant's share a 429 of type typ (its own excess, counted and logged by overShare),
// over the whole budget a 503 overloaded. what and doing name the bytes in the messages ("submit
// bodies", "being read"). authenticated is whether r came with a token.
func (s *Server) takeBudget(w http.ResponseWriter, r *http.Request, budget *bodyBudget, tenant string, authenticated bool, n int64, typ, what, doing string) bool {
	switch budget.take(tenant, n) {
	case bodyOverShare:
		// The tenant's own fill its share: a limit of its own, as its submit rate is.
		writeError(w, r, s.cfg.Logger, s.overShare(r, tenant, authenticated, &httpError{status: http.StatusTooManyRequests, typ: typ,
			message: "this tenant's " + what + " " + doing + " fill half of this replica's budget; retry shortly",
			header:  http.Header{"Retry-After": {"1"}}}))
		return false
	case bodyOverBudget:
		writeError(w, r, s.cfg.Logger, &httpError{status: http.StatusServiceUnavailable, typ: "overloaded",
			message: "too many " + what + " are " + doing + " at once; retry shortly", header: http.Header{"Retry-After": {"1"}}})
		return false
	}
	return true
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	tn, err := s.tenant(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	job, err := s.jobOf(r, tn)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	held, ok := s.holdAnswer(w, r, tn.Name, job)
	if !ok {
		return
	}
	defer s.answerBytes.give(tn.Name, held)
	s.writeJob(w, http.StatusOK, job)
}

// holdAnswer counts job's result in the answers' budget (answerBytes) for tenant, held bytes of
// it, which the caller gives back once its answer is written: at most a tenant's share, so that a
// result larger than the share is answered alone. Refused, it has answered r (429
// too_many_answers, 503 overloaded) and ok is false. A job without a result (waiting, running)
// holds nothing (0) and takes no turn at the budget's lock. No closure is made: a poll of every
// finished job comes here.
func (s *Server) holdAnswer(w http.ResponseWriter, r *http.Request, tenant string, job *jobs.Job) (held int64, ok bool) {
	held = min(int64(len(job.Result)), s.answerBytes.share)
	if held == 0 {
		return 0, true
	}
	_, authenticated := r.Header["Authorization"]
	if !s.takeBudget(w, r, s.answerBytes, tenant, authenticated, held, "too_many_answers", "job results", "being answered") {
		return 0, false
	}
	return held, true
}

// jobOf returns the job named by the path if it is tn's; another tenant's job is
// jobs.ErrNotFound, exactly like a missing one. The job is read without its request (a poll's,
// a cancel's: the job JSON does not carry it, and a poll read a body of up to
// api.max_body_bytes each time).
func (s *Server) jobOf(r *http.Request, tn *tenant.Tenant) (*jobs.Job, error) {
	job, err := s.cfg.Store.GetWithoutRequest(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if job.Tenant != tn.Name {
		return nil, jobs.ErrNotFound
	}
	return job, nil
}

// cancel ends a job that has not ended, or a dead one (no operator's retry then sends it: see
// jobs.Store.Cancel): the transition in Postgres first (after it no result can be stored), then
// the abort of its task, wherever it runs. A job already canceled answers 200 and the job, as the
// first cancel did: a client that lost that answer and sends the DELETE again learns that its
// cancel took, and its task is aborted again (not counted again): the first cancel's abort may
// never have run (its commit's answer lost, or Redis refused it), and an attempt in flight would
// go on until its lease's next renewal. Another end is 409 job_terminal.
//
// Its transition holds one of its tenant's places of MaxKeyedSubmitsPerTenant (tenantGate,
// shared with its keyed submits): a cancel's statement waits in Postgres for its job's row
// lock, and a tenant's flood of them (the same DELETE resent, each behind the last) took every
// connection of the pool. One over them waits up to StoreWait for a place, then is answered 429
// too_many_cancels with Retry-After. See cancelStage for when the job is read before.
func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	tn, err := s.tenant(r)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	job, canceled, err := s.cancelStage(r, tn)
	if err != nil {
		writeError(w, r, s.cfg.Logger, err)
		return
	}
	if canceled {
		s.cfg.Metrics.canceled(job.Credential)
	}
	// Canceled before too: that cancel's abort may not have run (its answer lost with its
	// commit's), and an abort is idempotent (a signal, and the delete of a waiting task).
	if s.cfg.Tasks != nil {
		// The job is canceled whatever Redis says: the worker skips terminal jobs, and an
		// attempt already in flight stops, unstored, at its lease's next renewal (within 5 s).
		// Nor does it wait for a stalled Redis past dispatch.RedisWait.
		if err := s.cfg.AfterCommit.Run(func() error { return s.cfg.Tasks.AbortEnded(job) }); err != nil {
			s.cfg.Logger.WarnContext(r.Context(), "abort canceled job's task", "job_id", job.ID, "error", err)
		}
	}
	s.writeJob(w, http.StatusOK, job)
}

// cancelStage is a cancel's transition of tn's job named by the path (jobs.Store.CancelOf),
// within one of tn's places of Server.keyed. It returns the job, and whether this cancel ended
// it (false: another cancel did, before or meanwhile, and the job is as it is now).
//
// With a place free, the cancel's one statement is the job's only read, also for the answer to
// a cancel resent (a job canceled before). With none, the job is read first, outside the places,
// as a poll's: a cancel of a job missing or ended (but dead) has no transition to make, and is
// answered without waiting for a place, whatever its tenant's other requests hold; one of a live
// or dead job waits for a place.
func (s *Server) cancelStage(r *http.Request, tn *tenant.Tenant) (job *jobs.Job, canceled bool, err error) {
	id := r.PathValue("id")
	release, ok := s.keyed.tryEnter(tn.Name)
	if !ok {
		job, err := s.jobOf(r, tn)
		switch {
		case err != nil:
			return nil, false, err
		case job.Status == jobs.StatusCanceled:
			return job, false, nil
		case job.Status.Terminal() && job.Status != jobs.StatusDead:
			// An end no status follows: jobs.Store.Cancel's answer, without its statement.
			return nil, false, &jobs.TerminalError{Status: job.Status}
		}
		release, err = s.keyed.enter(r.Context(), tn.Name, s.cfg.StoreWait, tooManyCancels)
		if err != nil {
			var he *httpError
			if errors.As(err, &he) {
				_, withToken := r.Header["Authorization"]
				err = s.overShare(r, tn.Name, withToken, he)
			}
			return nil, false, err
		}
	}
	defer release()
	job, err = s.cfg.Store.CancelOf(r.Context(), tn.Name, id)
	var te *jobs.TerminalError
	if errors.As(err, &te) && te.Status == jobs.StatusCanceled {
		return te.Job, false, nil // the job as the cancel read it
	}
	return job, err == nil, err
}

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// httpError is an error with its HTTP answer.
type httpError struct {
	status  int
	typ     string
	message string
	header  http.Header // set on the response
}

func (e *httpError) Error() string { return e.message }

// writeError answers err: the one table from errors to HTTP statuses and machine codes
// (errorAnswer). Nothing is written when the client left.
func writeError(w http.ResponseWriter, r *http.Request, logger *slog.Logger, err error) {
	he := errorAnswer(r, logger, err)
	if he == nil {
		return
	}
	for k, v := range he.header {
		w.Header()[k] = v
	}
	writeJSON(w, he.status, map[string]any{"error": map[string]string{"type": he.typ, "message": truncateMessage(he.message)}})
}

// errorAnswer is the one table from errors to HTTP statuses and machine codes: err's answer to
// r, logged when it is the server's failure; nil when the client left (nothing to answer).
func errorAnswer(r *http.Request, logger *slog.Logger, err error) *httpError {
	he, failure := classifyError(r, err)
	if failure != nil {
		logger.Log(r.Context(), failure.level, failure.msg, "method", r.Method, "path", r.URL.Path, "error", err)
	}
	return he
}

// serverFailure is how an answer that is the server's failure is logged: its line's message
// and level.
type serverFailure struct {
	msg   string
	level slog.Level
}

// The server's failures errorAnswer logs.
var (
	failureStoreTimedOut    = &serverFailure{"store timed out", slog.LevelWarn}
	failureStoreUnreachable = &serverFailure{"store unavailable", slog.LevelWarn}
	failureInternal         = &serverFailure{"internal error", slog.LevelError}
)

// unkeyedSubmitError is a submit's store error when the submit has no Idempotency-Key: its 503
// unavailable may come after the job was committed, and a resend makes a second job, which the
// answer's message says (classifyError).
type unkeyedSubmitError struct{ error }

func (e unkeyedSubmitError) Unwrap() error { return e.error }

// classifyError is errorAnswer's table, logging nothing: err's answer to r (nil when the client
// left), and how to log it when it is the server's failure (nil: a client's mistake, or a
// refusal counted elsewhere).
func classifyError(r *http.Request, err error) (*httpError, *serverFailure) {
	he, failure := classify(r, err)
	if he == nil || he.typ != "unavailable" {
		return he, failure
	}
	// errors.AsType: the target of errors.As would escape, an allocation on every answer
	// (TestServer_SubmitRefusedAllocs).
	if _, unkeyed := errors.AsType[unkeyedSubmitError](err); unkeyed {
		c := *he // he may be err's own
		c.message = strings.TrimSuffix(he.message, "; retry shortly") +
			"; the job may have been stored, and a resend may make a second one: only a submit with an Idempotency-Key is safe to resend"
		he = &c
	}
	return he, failure
}

// classify is classifyError's table, for any request.
func classify(r *http.Request, err error) (*httpError, *serverFailure) {
	var he *httpError
	var inv *InvalidError
	var term *jobs.TerminalError
	switch {
	case errors.As(err, &he):
	case errors.As(err, &inv):
		he = &httpError{status: cmp.Or(inv.Status, http.StatusBadRequest), typ: inv.Type, message: inv.Message}
	case errors.As(err, &term):
		he = &httpError{status: http.StatusConflict, typ: "job_terminal", message: term.Error()}
	case errors.Is(err, jobs.ErrUnstorable):
		he = &httpError{status: http.StatusBadRequest, typ: "invalid_body", message: err.Error()}
	case errors.Is(err, jobs.ErrNotFound):
		he = &httpError{status: http.StatusNotFound, typ: "not_found", message: "no job with that id"}
	case errors.Is(err, jobs.ErrIdempotencyKeyReused):
		he = &httpError{status: http.StatusUnprocessableEntity, typ: "idempotency_key_reused", message: "this Idempotency-Key was used with a different request body"}
	case errors.Is(err, jobs.ErrBusy):
		// Not the server's failure, nor a final answer (a 409 would read as one): the job was
		// retried and ended again under each of the cancel's tries; the next one likely takes.
		he = &httpError{status: http.StatusServiceUnavailable, typ: "job_busy",
			message: "the job's status kept changing under the cancel (an operator retrying it); nothing was done; retry shortly",
			header:  http.Header{"Retry-After": {"1"}}}
	case errors.Is(err, jobs.ErrKeyBusy):
		// As ErrBusy: nothing was stored, and the next try likely takes.
		he = &httpError{status: http.StatusServiceUnavailable, typ: "job_busy",
			message: "the job this Idempotency-Key held was deleted under each of the submit's tries; nothing was stored; retry shortly",
			header:  http.Header{"Retry-After": {"1"}}}
	case pgwait.TimedOut(r.Context(), err):
		// Checked before context.Canceled: the bound canceled the request's context
		// (storeBounded).
		he = &httpError{status: http.StatusServiceUnavailable, typ: "overloaded",
			message: "no database connection came free in time; retry shortly", header: http.Header{"Retry-After": {"1"}}}
	case errors.Is(context.Cause(r.Context()), errStoreTimeout):
		// Checked before context.Canceled and the unavailable store: the request's own bound
		// (storeBounded) ended a statement Postgres had not answered.
		return &httpError{status: http.StatusServiceUnavailable, typ: "unavailable",
			message: "the job store did not answer in time; retry shortly", header: http.Header{"Retry-After": {"5"}}}, failureStoreTimedOut
	case errors.Is(err, context.Canceled):
		return nil, nil // the client left
	case jobs.IsUnavailable(err):
		return &httpError{status: http.StatusServiceUnavailable, typ: "unavailable", message: "the job store is unreachable; retry shortly",
			header: http.Header{"Retry-After": {"5"}}}, failureStoreUnreachable
	default:
		return &httpError{status: http.StatusInternalServerError, typ: "internal", message: "internal error"}, failureInternal
	}
	return he, nil
}

// maxMessageBytes caps an error message: several echo a client's value (a credential name, a
// field name, a header), which must not turn a 4 MiB body into a 4 MiB answer.
const maxMessageBytes = 1024

func truncateMessage(m string) string {
	if len(m) <= maxMessageBytes {
		return m
	}
	cut := maxMessageBytes
	for cut > 0 && !utf8.RuneStart(m[cut]) {
		cut--
	}
	return m[:cut] + "…"
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
