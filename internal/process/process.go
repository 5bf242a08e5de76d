// Package process runs llmq's long-lived processes from their command-line arguments: the API
// (API), a worker (Worker), or both in one process (Serve). cmd/api, cmd/worker and cmd/llmq are
// its thin mains, so that the three share one way to load the config, open the stores, expose
// metrics and shut down.
//
// Serve is for a small deployment: one process holds the API and a worker, shares one Postgres
// pool and one metrics registry, and needs no second process to run. The separate processes
// remain for scaling the API and the workers apart; any mix of them may share one database and
// one Redis, since every hand-off between them goes through the stores.
package process

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/pgwait"
	"github.com/llmq/llmq/migrations"
)

// Options are what a process takes besides its command-line arguments.
type Options struct {
	// Stderr receives the logs (JSON lines) and flag errors. Default os.Stderr.
	Stderr io.Writer
	// Ready, when set, receives the API's bound address once it listens (API and Serve).
	Ready func(addr string)
	// Getenv reads the environment: the config file's path (LLMQ_CONFIG) and overrides, and
	// the provider keys the config names. Default os.Getenv.
	Getenv func(string) string
}

func (o Options) withDefaults() Options {
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	return o
}

// shutdownTimeout bounds how long a stopping process waits for its HTTP server's requests.
const shutdownTimeout = 10 * time.Second

// flags is a process's flag set with the flags every process has.
type flags struct {
	*flag.FlagSet
	configPath *string
	getenv     func(string) string
}

// Parse parses args and refuses a positional argument: Go's flag package stops at the first
// one, so a flag written after it (`worker llmq.yaml --metrics-listen off`) would be ignored.
// Both refusals are *UsageError.
func (f flags) Parse(args []string) error {
	if err := f.FlagSet.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &UsageError{Err: err, printed: true} // the flag package has printed it, with the flags
	}
	if f.NArg() > 0 {
		return &UsageError{Err: fmt.Errorf("%s: unexpected argument %q: it takes flags only (the config file is --config), and a flag after it would be ignored", f.Name(), f.Arg(0))}
	}
	// The runtime ignores a GOMAXPROCS it cannot read and takes every core: the share the
	// operator meant to give this process (docs/decisions.md) would be lost without a word. It
	// reads it as the runtime does (a base-10 number of 32 bits), so that one past 2^31-1 is
	// refused too.
	if v := f.getenv("GOMAXPROCS"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 32); err != nil || n < 1 {
			return fmt.Errorf("GOMAXPROCS: must be a whole number between 1 and 2147483647, got %q", v)
		}
	}
	return nil
}

// helpIsNoError is a command's answer to a Parse error: nil for -h or --help (the flag package
// has printed the flags; the process exits 0 without running), the error itself otherwise.
func helpIsNoError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// UsageError is a command line a command refuses (an unknown command or flag): the process exits
// 2, as the flag package's own ExitOnError does, and as ctl does for its usage errors, so that a
// script tells a mistyped command line from a failure of the run (1).
type UsageError struct {
	// Err says what is wrong with the command line.
	Err error
	// printed: the flag package has printed Err, with the flags; Exit prints it no more.
	printed bool
}

func (e *UsageError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *UsageError) Unwrap() error { return e.Err }

// ExitCode is what a command's main exits with after the command returned err, having printed
// "name: err" on stderr unless the flag package has printed it: 0 for nil, 2 for a *UsageError,
// 1 for any other error.
func ExitCode(stderr io.Writer, name string, err error) int {
	if err == nil {
		return 0
	}
	ue, usage := errors.AsType[*UsageError](err)
	if !usage || !ue.printed {
		fmt.Fprintln(stderr, name+":", err)
	}
	if usage {
		return 2
	}
	return 1
}

func newFlags(name string, o Options) flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(o.Stderr)
	return flags{FlagSet: fs, configPath: fs.String("config", o.Getenv(config.EnvConfig), "config file (env "+config.EnvConfig+")"),
		getenv: o.Getenv}
}

// checkListenFlag refuses a --listen or --metrics-listen (flag) that is not host:port, as the
// config refuses the fields they override: otherwise it fails only once the stores are open
// (the worker's, once it has started), and without the flag's name.
func checkListenFlag(flag, addr string) error {
	if _, port, err := net.SplitHostPort(addr); err != nil || port == "" {
		return fmt.Errorf("--%s: must be host:port, such as 127.0.0.1:8080 or :8080 (got %q)", flag, addr)
	}
	return nil
}

// checkMaxConnections refuses an api.max_connections the process cannot reach: past its
// open-file limit, accept fails and connections wait in the kernel's queue instead of getting
// the cap's 503.
func checkMaxConnections(cfg *config.Config) error {
	if n, limit := cfg.API.MaxConnections, httpserve.OpenFileLimit(); limit > 0 && n >= limit {
		return fmt.Errorf("api.max_connections: %d is not below the process's open-file limit (%d), which the stores' connections share: lower it, or raise the limit", n, limit)
	}
	return nil
}

// newLogger is the process's JSON logger, its lines tagged with the process kind.
func newLogger(o Options, kind string) *slog.Logger {
	return slog.New(slog.NewJSONHandler(o.Stderr, nil)).With("process", kind, "pid", os.Getpid())
}

// RedisLog is go-redis's logger on a process's JSON lines: each of go-redis's own lines (a
// failed dial while Redis is down, a pool's trouble) a warning "redis client", its text in
// message, where go-redis wrote plain text to stderr beside them. go-redis has one logger for
// the whole program, so a program's main sets it (redis.SetLogger), once, before it starts a
// process; tests, which run many processes in one program, leave go-redis's own.
type RedisLog struct{ logger *slog.Logger }

// NewRedisLog is the RedisLog of a program that runs a process of kind (api, worker, serve),
// writing to stderr as the process's logger does.
func NewRedisLog(stderr io.Writer, kind string) RedisLog {
	return RedisLog{newLogger(Options{Stderr: stderr}, kind)}
}

// Printf logs go-redis's line.
func (l RedisLog) Printf(ctx context.Context, format string, v ...any) {
	l.logger.WarnContext(ctx, "redis client", "message", fmt.Sprintf(format, v...))
}

// openPool opens the config's database, waiting for Postgres to come up, and migrates it. A URL
// migrations refuses is named as the user wrote it: database_url, or LLMQ_DATABASE_URL when
// getenv has it (it overrode the file's).
func openPool(ctx context.Context, cfg *config.Config, getenv func(string) string, logger *slog.Logger) (*pgxpool.Pool, error) {
	pool, err := migrations.OpenWaitWatch(ctx, cfg.DatabaseURL, func(err error, wait time.Duration) {
		logger.Warn("postgres not reachable yet; trying again", "error", err, "retry_in", wait.String())
	}, migrations.LockWatch{Report: func(w migrations.LockWait) { logLockWait(logger, w) }})
	setting := "database_url"
	if getenv(config.EnvDatabaseURL) != "" {
		setting = config.EnvDatabaseURL
	}
	return pool, migrations.NameURLSetting(err, setting)
}

// evictionCheckTimeout bounds the start-up's read of Redis's maxmemory-policy: a Redis not up yet
// delays the start by no more.
const evictionCheckTimeout = 2 * time.Second

// checkRedis is the start-up's look at the config's Redis. It logs a warning when the Redis may
// evict keys (it has a memory limit and its maxmemory-policy is not noeviction): llmq's tasks,
// limiter buckets and pauses would be dropped without a word once it is full. A Redis that
// refuses CONFIG (a managed one) or does not answer gets one line at info saying that the policy
// could not be read and must be noeviction: the check is advice, and the operator checks in its
// place. A Redis that answers that redis_url's database does not exist is an error: every
// command would fail the same way, and the process would run dispatching nothing.
func checkRedis(ctx context.Context, cfg *config.Config, getenv func(string) string, logger *slog.Logger) error {
	opt, err := dispatch.RedisConnOpt(cfg.RedisURL)
	if err != nil {
		return nil // the API's and the worker's own parse report it
	}
	rerr, ok := errors.AsType[redis.Error](checkEviction(ctx, dispatch.NewRedisClient(opt), evictionCheckTimeout, logger))
	if !ok || !strings.Contains(rerr.Error(), "DB index is out of range") {
		return nil
	}
	field := "redis_url"
	if getenv(config.EnvRedisURL) != "" {
		field += " (from " + config.EnvRedisURL + ")"
	}
	db := "that database"
	if o, perr := redis.ParseURL(cfg.RedisURL); perr == nil {
		db = "database " + strconv.Itoa(o.DB)
	}
	return fmt.Errorf("%s: Redis has no %s (it answered %q): name one below its databases setting (16 unless set)", field, db, rerr.Error())
}

// checkEviction is checkRedis's check on rdb, which it closes: it ends within bound whatever
// rdb's own read timeout (go-redis's reads keep theirs, seconds or none, whatever ctx says), since
// closing the client at the bound ends a read that a silent Redis leaves waiting. It returns the
// read's error, which it has logged.
func checkEviction(ctx context.Context, rdb redis.UniversalClient, bound time.Duration, logger *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = rdb.Close() })
	defer func() {
		if stop() {
			_ = rdb.Close()
		}
	}()
	policy, err := dispatch.EvictionPolicy(ctx, rdb)
	switch {
	case err != nil:
		logger.Info("could not read redis's maxmemory-policy; it must be noeviction "+
			"(docs/operations.md, Redis)", "error", err)
	case policy != dispatch.NoEviction:
		logger.Warn("redis may evict llmq's keys (queued tasks, rate-limit state, pauses) when it is full: set maxmemory-policy noeviction",
			"maxmemory_policy", policy, "fix", "CONFIG SET maxmemory-policy noeviction, and the same in redis.conf or the provider's parameter group")
	}
	return err
}

// logLockWait logs a wait for the migration lock that another process holds (its migrations, or
// `ctl migrate`, under way): the process has not hung, it waits for them.
func logLockWait(logger *slog.Logger, w migrations.LockWait) {
	attrs := []any{"waited", w.Waited.Round(time.Second).String()}
	switch {
	case w.Holder != nil:
		attrs = append(attrs, "holder_pid", w.Holder.PID, "holder", w.Holder.String())
	case w.Err != nil:
		attrs = append(attrs, "error", w.Err)
	}
	logger.Warn("waiting for the migration lock, which another session holds (a migration under way elsewhere)", attrs...)
}

// newRegistry is a metrics registry holding the Go runtime's and the process's collectors, and
// the saturation of the process's Postgres pool (pgwait.Collector).
func newRegistry(pool *pgxpool.Pool) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		pgwait.NewCollector(pool))
	return reg
}

// server is an HTTP server bound to its listener, with llmq's timeouts (httpserve).
type server struct {
	srv *http.Server
	ln  net.Listener
	log *slog.Logger
	// grace is how long a shutdown lets the requests under way finish (shutdownTimeout).
	grace time.Duration
	// drainDelay, when positive, is how long a stopping server goes on accepting connections
	// after calling drain (which makes /readyz answer 503), before it stops listening: the time
	// a load balancer takes to stop sending it requests (api.drain_delay).
	drainDelay time.Duration
	drain      func()
	// after waits for the drain delay (time.After when nil).
	after func(time.Duration) <-chan time.Time
}

// listen binds addr and builds the server for handler with the api section's timeouts. With
// capped, the listener also holds the api section's connection cap.
func listen(addr string, handler http.Handler, cfg *config.Config, reg *prometheus.Registry, logger *slog.Logger, capped bool) (*server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	if capped {
		// Hostile clients: a cap on open connections that answers 503 beyond it.
		ln = httpserve.LimitListener(ln, cfg.API.MaxConnections, httpserve.NewMetrics(reg))
	}
	serverCfg := httpserve.FromConfig(cfg.API) // the api section's timeouts apply to every server
	serverCfg.ErrorLog = logger
	return &server{srv: httpserve.NewServer(handler, serverCfg), ln: ln, log: logger, grace: shutdownTimeout}, nil
}

// serve serves until ctx ends or the server fails, then shuts the server down gracefully: it
// stops listening and lets the requests under way finish for up to grace, then closes the
// connections of those still running (their contexts end), so that none outlives the stores
// the process closes next. Cutting them is the shutdown as documented, not a failure: serve
// logs it and returns nil (a stop in a rolling restart exits 0, even with a slow client).
//
// With a drain delay, it first calls drain and goes on serving, new connections included, for
// the delay: a load balancer that has not yet seen /readyz's 503 still sends requests, which
// are answered instead of refused.
func (s *server) serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	if s.drainDelay > 0 {
		if s.drain != nil {
			s.drain()
		}
		s.log.Info("draining: /readyz answers 503; still serving until the drain delay ends", "drain_delay", s.drainDelay.String())
		after := s.after
		if after == nil {
			after = time.After
		}
		select {
		case err := <-errc:
			return err
		case <-after(s.drainDelay):
		}
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.grace)
	defer cancel()
	err := s.srv.Shutdown(sctx)
	switch {
	case err == nil || errors.Is(err, http.ErrServerClosed):
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		s.log.Warn("HTTP requests still running at the end of the shutdown timeout were cut", "waited", s.grace.String())
		if err := s.srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("close the HTTP server's connections: %w", err)
		}
		return nil
	default:
		return fmt.Errorf("shut the HTTP server down: %w", err)
	}
}
