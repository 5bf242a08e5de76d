package api

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/deltastream"
	"github.com/llmq/llmq/internal/dispatch"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/tenant"
	"github.com/llmq/llmq/internal/tokens"
)

// enqueueBatches is how many batches of the submits' enqueues may be in flight to Redis at once
// (dispatch.AutoPipelined). With one, a submit's enqueue, then its wake-up (which went through
// the same autopipeliner then), each waited while the batch before it made its round trip. With
// four, at full throttle: jobs/s 1.01-1.04 × and CPU per job 0.96-0.99 × (medians of three series
// of order-swapped pairs); at 500 jobs/s no change past the pairs' spread.
const enqueueBatches = 4

// FromConfig builds a Server from the config file on a migrated pool, registering its metrics on
// reg, and starts its job event listener (one Postgres connection of its own, shared by every
// event stream of this process). The returned close function ends the event streams, stops the
// listener and releases the Redis connections (not the pool); call it once, after the HTTP
// server stopped.
func FromConfig(cfg *config.Config, pool *pgxpool.Pool, reg *prometheus.Registry, logger *slog.Logger) (*Server, func() error, error) {
	return FromConfigWith(cfg, pool, reg, logger, Options{})
}

// Options are FromConfigWith's knobs that the config file does not hold.
type Options struct {
	// RedisPrefix starts llmq's own Redis keys: those the console reads (the workers' prefix) and
	// the tenants' submit rates. Default "llmq:"; tests isolate with their own.
	RedisPrefix string
	// Store is the job store, shared with the worker of the same process (llmq serve) so that
	// both send their statements through one batcher. Default: a store of its own on the pool.
	Store *jobs.Store
	// Handoff, when set, runs the first delivery of the jobs this API creates in its process
	// (llmq serve; see Config.Handoff).
	Handoff *dispatch.Handoff
	// KeepAlive is Config.KeepAlive: the interval of the event streams' keep-alives, at which an
	// idle stream also checks its token again. Default 15s; tests shorten it rather than wait.
	KeepAlive time.Duration
	// TenantTTL is how long the API reuses a tenant lookup's answer (tenant.AuthenticatorConfig.
	// TTL): how long a revocation takes to reach its requests and streams. Default
	// tenant.DefaultCacheTTL; tests shorten it rather than wait.
	TenantTTL time.Duration
	// StoreWait is Config.StoreWait: how long a submit, a poll or a cancel waits for a free pool
	// connection, or for a place among its tenant's keyed submits and cancels (past it: 503
	// overloaded, 429 too_many_submits or too_many_cancels). Default 5s; tests that queue many
	// requests behind those places on a loaded machine lengthen it rather than be refused.
	StoreWait time.Duration
}

// FromConfigWith is FromConfig with Options.
func FromConfigWith(cfg *config.Config, pool *pgxpool.Pool, reg *prometheus.Registry, logger *slog.Logger, opts Options) (*Server, func() error, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	redisOpt, err := dispatch.RedisConnOpt(cfg.RedisURL)
	if err != nil {
		return nil, nil, err
	}
	var signer *StreamSigner
	if key, err := cfg.API.StreamSecret(); err != nil {
		return nil, nil, err
	} else if key != nil {
		if signer, err = NewStreamSigner(key, cfg.API.StreamURLTTL, nil); err != nil {
			return nil, nil, err
		}
	}
	rdb := dispatch.NewRedisClient(redisOpt)
	// Concurrent submits share round trips for their enqueues, in up to enqueueBatches batches
	// at once, and for their wake-ups, which a submit sends once its enqueue's reply came (so
	// that the woken worker finds the task) but does not wait for (dispatch.Deferred). Both are
	// closed with rdb (asynq refuses to close a connection it was given).
	// The autopipeliner runs each batch on a goroutine of its own: grown once, while shallow.
	dispatch.GrowStacks(rdb)
	pipelined := dispatch.AutoPipelined(rdb, enqueueBatches)
	aclient := asynq.NewClientFromRedisClient(pipelined)
	inspector := asynq.NewInspector(redisOpt)
	store := opts.Store
	if store == nil {
		store = jobs.NewStore(pool, nil)
	}
	names := make([]string, 0, len(cfg.Credentials))
	kinds := map[string]string{}
	tokenLimits := map[string]tokens.Limits{}
	batchWindows := map[string]time.Duration{}
	for _, c := range cfg.Credentials {
		names = append(names, c.Name)
		if c.Batch.Enabled {
			batchWindows[c.Name] = c.Batch.Window
		}
		kinds[c.Name] = c.Provider
		if l := c.Limits; l != nil {
			tokenLimits[c.Name] = tokens.Limits{InputPerMinute: l.InputTokensPerMinute,
				OutputPerMinute: l.OutputTokensPerMinute, CombinedPerMinute: l.TokensPerMinute}
		}
	}
	enqueuer := dispatch.NewEnqueuer(aclient, cfg.Worker.Queue, dispatch.Deferred(rdb))

	connCfg := pool.Config().ConnConfig.Copy()
	connCfg.RuntimeParams["application_name"] = "llmq-api-listener"
	metrics := NewMetrics(reg)
	listener := jobs.NewListener(jobs.ListenerConfig{ConnConfig: connCfg, Logger: logger, ChannelFuncs: metrics.listenerFuncs()})
	var submitRate *tenant.RateLimiter
	if r := cfg.API.TenantSubmitRate; r != nil {
		if submitRate, err = tenant.NewRateLimiter(rdb, &tenant.RateLimiterConfig{
			Rate: tenant.Rate{PerSecond: r.RequestsPerSecond, Burst: r.Burst}, Prefix: opts.RedisPrefix}); err != nil {
			return nil, nil, errors.Join(err, inspector.Close(), rdb.Close())
		}
	}
	// One bound for the process: the submits' enqueues, and the API's and the console's aborts
	// and requeues, all wait on the same Redis.
	afterCommit := dispatch.NewAfterCommit(nil)
	if err := reg.Register(afterCommit); err != nil {
		return nil, nil, errors.Join(err, inspector.Close(), rdb.Close())
	}
	// The console's live pages take the server's stream places (api.max_streams), of the Server
	// built below: none opens before it serves.
	var s *Server
	openStream := func() (func(), time.Duration, bool) { return s.streams.openConsole() }
	con, err := newConsole(cfg, opts.RedisPrefix, pool, store, rdb, dispatch.NewTasks(inspector, enqueuer), afterCommit, listener, openStream, metrics, logger)
	if err != nil {
		return nil, nil, errors.Join(err, inspector.Close(), rdb.Close())
	}
	deltas := deltastream.New(deltastream.Config{Redis: rdb, Logger: logger,
		MaxLen: cfg.Streaming.BufferMaxEntries, TTL: cfg.Streaming.BufferTTL}) // the API only reads
	hub := deltas.NewHub()
	s = New(Config{
		Store: store, Enqueuer: enqueuer, Handoff: opts.Handoff, Metrics: metrics, Pool: pool, Redis: rdb, Gatherer: reg,
		Submit:         SubmitConfig{Credentials: names, Kinds: kinds, TokenLimits: tokenLimits, BatchWindows: batchWindows, DefaultMaxAttempts: cfg.Retry.MaxAttempts},
		AllowAnonymous: cfg.API.AllowAnonymous, MaxBodyBytes: cfg.API.MaxBodyBytes,
		MaxBodyBytesInFlight: cfg.API.MaxBodyBytesInFlight, Logger: logger,
		Listener: listener, Tasks: dispatch.NewTasks(inspector, enqueuer), AfterCommit: afterCommit,
		Tenants:    tenant.NewAuthenticator(tenant.NewStore(pool, nil), &tenant.AuthenticatorConfig{TTL: opts.TenantTTL}),
		SubmitRate: submitRate, StreamSigner: signer, Console: con,
		EventWriteTimeout: cfg.API.EventWriteTimeout, MaxStreamsPerTenant: cfg.API.MaxStreamsPerTenant,
		MaxKeyedSubmitsPerTenant: cfg.API.MaxKeyedSubmitsPerTenant, StoreTimeout: cfg.API.StoreTimeout,
		MaxStreams: cmp.Or(cfg.API.MaxStreams, defaultMaxStreams(cfg.API.MaxConnections)),
		Deltas:     deltas, DeltaHub: hub, KeepAlive: opts.KeepAlive, StoreWait: opts.StoreWait,
	})
	ctx, stop := context.WithCancel(context.Background())
	listening := make(chan error, 1)
	go func() { listening <- listener.Run(ctx) }()
	return s, func() error {
		s.Shutdown()
		stop()
		return errors.Join(<-listening, hub.Close(), inspector.Close(), rdb.Close())
	}, nil
}
