// Package worker wires a worker process: providers from the config, the jobs handler on an asynq
// server, and the sweeper. cmd/worker is its thin main; tests and benchmarks run it in-process.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/breaker"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/estimator"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/retrypolicy"
)

// Options are the in-process knobs a config file does not carry.
type Options struct {
	// Logger receives the worker's logs. Default discards.
	Logger *slog.Logger
	// Registerer receives the worker's metrics. Default: none.
	Registerer prometheus.Registerer
	// HTTPClient is used for provider calls. Default: llm's default client.
	HTTPClient *http.Client
	// RedisPrefix starts the limiter's and alerter's Redis keys. Default "llmq:"; tests isolate
	// themselves with redistest.Prefix.
	RedisPrefix string
}

// Worker is one worker process's moving parts.
type Worker struct {
	cfg     *config.Config
	opts    Options
	pool    *pgxpool.Pool
	redis   asynq.RedisConnOpt
	server  *asynq.Server
	handler *jobs.Handler
	sweeper *jobs.Sweeper
	breaker *breaker.Breaker
	client  *asynq.Client
	insp    *asynq.Inspector
	rdb     redis.UniversalClient
}

// New connects to the stores (the database must be migrated) and builds the worker.
func New(ctx context.Context, cfg *config.Config, pool *pgxpool.Pool, opts Options) (*Worker, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	redisOpt, err := jobs.RedisConnOpt(cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	var metrics *jobs.Metrics
	var limMetrics *limiter.Metrics
	var brkMetrics *breaker.Metrics
	var tokMetrics *estimator.Metrics
	if opts.Registerer != nil {
		tokMetrics = estimator.NewMetrics(opts.Registerer)
		metrics = jobs.NewMetrics(opts.Registerer)
		limMetrics = limiter.NewMetrics(opts.Registerer)
		brkMetrics = breaker.NewMetrics(opts.Registerer)
	}
	rdb := jobs.NewRedisClient(redisOpt)
	// The breaker's calls of concurrent jobs share round trips. The limiter and asynq keep a
	// plain client: through the autopipeliner the limiter's learned token limits paced worse, and
	// asynq's dequeues measured slower (docs/decisions.md).
	pipelined := jobs.AutoPipelined(rdb)
	lim, err := limiter.New(rdb, &limiter.Config{Prefix: opts.RedisPrefix, Metrics: limMetrics, TokenMinute: cfg.Worker.TokenMinute})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	successMemory := time.Duration(-1) // the cold-start cap is off unless configured
	if cfg.Breaker.ColdStartCap {
		successMemory = 0 // the breaker's default
	}
	brk, err := breaker.New(pipelined, &breaker.Config{Prefix: opts.RedisPrefix, Threshold: cfg.Breaker.Threshold,
		Cooldown: cfg.Breaker.Cooldown, MaxCooldown: cfg.Breaker.MaxCooldown, SuccessMemory: successMemory,
		Metrics: brkMetrics})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	creds := map[string]jobs.Credential{}
	for _, c := range cfg.Credentials {
		kind, err := llm.ParseKind(c.Provider)
		if err != nil {
			return nil, fmt.Errorf("credential %q: %w", c.Name, err)
		}
		p, err := llm.New(llm.Config{Kind: kind, BaseURL: c.BaseURL, APIKey: c.APIKey(), HTTPClient: opts.HTTPClient})
		if err != nil {
			return nil, fmt.Errorf("credential %q: %w", c.Name, err)
		}
		jc := jobs.Credential{Name: c.Name, Kind: string(kind), Provider: p, AttemptTimeout: c.AttemptTimeout, FirstByteTimeout: c.FirstByteTimeout,
			Limiter: lim.Credential(c.LimiterID(), c.Name), Breaker: brk.Credential(c.LimiterID(), c.Name),
			PauseProbeInterval: c.PauseProbeInterval}
		if l := c.Limits; l != nil {
			jc.Limit = limiter.Limit{Rate: l.RequestsPerSecond, Burst: l.Burst, InputTokensPerMinute: l.InputTokensPerMinute,
				OutputTokensPerMinute: l.OutputTokensPerMinute, TokensPerMinute: l.TokensPerMinute}
		}
		creds[c.Name] = jc
	}
	policy := retrypolicy.New(&retrypolicy.Config{BaseDelay: cfg.Retry.BaseDelay, MaxDelay: cfg.Retry.MaxDelay})
	store := jobs.NewStore(pool, nil)
	w := &Worker{cfg: cfg, opts: opts, pool: pool, redis: redisOpt, rdb: rdb, breaker: brk}
	alerter := jobs.NewAlerter(jobs.AlerterConfig{WebhookURL: cfg.Alerts.WebhookURL, Redis: rdb,
		Prefix: opts.RedisPrefix, Logger: opts.Logger})
	estimator, err := estimator.New(&estimator.Config{Metrics: tokMetrics})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	w.handler = jobs.NewHandler(jobs.HandlerConfig{
		Store: store, Credentials: creds, Policy: policy, Logger: opts.Logger, Metrics: metrics, Alerter: alerter,
		Estimator: estimator,
	})
	w.client = asynq.NewClient(redisOpt)
	w.insp = asynq.NewInspector(redisOpt)
	w.sweeper = jobs.NewSweeper(jobs.SweeperConfig{
		Store: store, Enqueuer: jobs.NewEnqueuer(w.client, cfg.Worker.Queue), Inspector: w.insp, Redis: rdb,
		Queue: cfg.Worker.Queue, Interval: cfg.Worker.SweepInterval, Logger: opts.Logger, Metrics: metrics,
	})
	w.server = asynq.NewServer(redisOpt, asynq.Config{
		Concurrency: cfg.Worker.Concurrency,
		Queues:      map[string]int{cfg.Worker.Queue: 1},
		// asynq polls an idle queue every TaskCheckInterval (default 1s, ~0.5s p50 added to
		// every job) and moves due retries every DelayedTaskCheckInterval (default 5s). Both
		// bound how precisely we keep the limiter's and Retry-After's times.
		TaskCheckInterval:        cfg.Worker.PollInterval,
		DelayedTaskCheckInterval: 50 * time.Millisecond,
		RetryDelayFunc:           jobs.RetryDelayFunc(policy, time.Now),
		IsFailure:                jobs.IsFailure,
		ShutdownTimeout:          10 * time.Second,
		Logger:                   asynqLogger{opts.Logger},
		LogLevel:                 asynq.WarnLevel,
	})
	return w, nil
}

// Run processes jobs and sweeps until ctx ends, then shuts down gracefully.
func (w *Worker) Run(ctx context.Context) error {
	mux := asynq.NewServeMux()
	mux.Handle(jobs.TaskType, w.handler)
	if err := w.server.Start(mux); err != nil {
		return fmt.Errorf("start asynq server: %w", err)
	}
	sweepDone, listenDone := make(chan error, 1), make(chan struct{})
	go func() { sweepDone <- w.sweeper.Run(ctx) }()
	go func() {
		defer close(listenDone)
		w.breaker.Listen(ctx)
	}()
	<-ctx.Done()
	w.server.Shutdown()
	<-listenDone
	return errors.Join(<-sweepDone, w.client.Close(), w.insp.Close(), w.rdb.Close())
}

// asynqLogger routes asynq's printf-style logs into slog.
type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...), "component", "asynq") }
