package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/jobs"
	"github.com/llmq/llmq/internal/worker"
)

// API runs the HTTP API (submit, poll, events, console) until ctx ends, then stops taking
// requests and ends open event streams. It never reads a provider key. Flags: --config,
// --listen (overrides api.listen).
func API(ctx context.Context, args []string, o Options) error {
	o = o.withDefaults()
	fs := newFlags("api", o)
	listenAddr := fs.String("listen", "", "override api.listen")
	if err := fs.Parse(args); err != nil {
		return helpIsNoError(err)
	}
	cfg, err := config.LoadWithoutSecrets(*fs.configPath, o.Getenv) // the API never calls a provider
	if err != nil {
		return err
	}
	if err := checkMaxConnections(cfg); err != nil {
		return err
	}
	if *listenAddr != "" {
		if err := checkListenFlag("listen", *listenAddr); err != nil {
			return err
		}
		cfg.API.Listen = *listenAddr
	}
	logger := newLogger(o, "api")
	pool, err := openPool(ctx, cfg, o.Getenv, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkRedis(ctx, cfg, o.Getenv, logger); err != nil {
		return err
	}
	reg := newRegistry(pool)
	handler, closeAPI, err := api.FromConfig(cfg, pool, reg, logger)
	if err != nil {
		return err
	}
	defer closeAPI()
	srv, err := listenAPI(cfg, handler, reg, logger)
	if err != nil {
		return err
	}
	return srv.serveAPI(ctx, o)
}

// Worker runs a worker (asynq server, executor, sweeper, maintenance) until ctx ends, then
// hands back the tasks it has not finished. Flags: --config, --metrics-listen (overrides
// worker.metrics_listen; "off" serves no metrics).
func Worker(ctx context.Context, args []string, o Options) error {
	o = o.withDefaults()
	fs := newFlags("worker", o)
	metricsListen := fs.String("metrics-listen", "", "override worker.metrics_listen (\"off\" disables)")
	if err := fs.Parse(args); err != nil {
		return helpIsNoError(err)
	}
	cfg, err := config.Load(*fs.configPath, o.Getenv)
	if err != nil {
		return err
	}
	if *metricsListen != "" {
		if *metricsListen != "off" {
			if err := checkListenFlag("metrics-listen", *metricsListen); err != nil {
				return err
			}
		}
		cfg.Worker.MetricsListen = *metricsListen
	}
	logger := newLogger(o, "worker")
	pool, err := openPool(ctx, cfg, o.Getenv, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkRedis(ctx, cfg, o.Getenv, logger); err != nil {
		return err
	}
	reg := newRegistry(pool)
	w, err := worker.New(ctx, cfg, pool, worker.Options{Logger: logger, Registerer: reg})
	if err != nil {
		return err
	}
	if cfg.Worker.MetricsListen != "off" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		srv, err := listen(cfg.Worker.MetricsListen, mux, cfg, reg, logger, false)
		if err != nil {
			return errors.Join(fmt.Errorf("metrics: %w", err), w.Close())
		}
		metricsDone := make(chan error, 1)
		mctx, stopMetrics := context.WithCancel(ctx)
		go func() { metricsDone <- srv.serve(mctx) }()
		defer func() {
			stopMetrics()
			if err := <-metricsDone; err != nil {
				logger.Error("metrics server", "error", err)
			}
		}()
	}
	logger.Info("worker started", "queue", cfg.Worker.Queue, "concurrency", cfg.Worker.Concurrency)
	return w.Run(ctx)
}

// Serve runs the API and a worker in one process until ctx ends: one config (the worker's, with
// the provider keys), one Postgres pool and job store (whose batcher commits the API's creates
// and the worker's transitions together), one metrics registry served on the API's /metrics. A
// job still goes through Postgres and asynq as with separate processes, so serve processes,
// APIs and workers mix freely on one database and Redis. When either half fails, both stop.
// Flags: --config, --listen (overrides api.listen).
func Serve(ctx context.Context, args []string, o Options) error {
	o = o.withDefaults()
	fs := newFlags("serve", o)
	listenAddr := fs.String("listen", "", "override api.listen")
	if err := fs.Parse(args); err != nil {
		return helpIsNoError(err)
	}
	cfg, err := config.Load(*fs.configPath, o.Getenv)
	if err != nil {
		return err
	}
	if err := checkMaxConnections(cfg); err != nil {
		return err
	}
	if *listenAddr != "" {
		if err := checkListenFlag("listen", *listenAddr); err != nil {
			return err
		}
		cfg.API.Listen = *listenAddr
	}
	logger := newLogger(o, "serve")
	if m := cfg.Worker.MetricsListen; m != "off" && m != config.DefaultMetricsListen {
		logger.Warn("worker.metrics_listen is not used by llmq serve: the worker's metrics are on the API's /metrics, with the API's",
			"worker.metrics_listen", m, "api.listen", cfg.API.Listen)
	}
	pool, err := openPool(ctx, cfg, o.Getenv, logger)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkRedis(ctx, cfg, o.Getenv, logger); err != nil {
		return err
	}
	reg := newRegistry(pool)
	// One store: the API's creates and the worker's transitions share the batcher's commits.
	store := jobs.NewStore(pool, nil)
	// The worker takes the first delivery of the API's new jobs in this process (Handoff).
	w, err := worker.New(ctx, cfg, pool, worker.Options{Logger: logger, Registerer: reg, Store: store, Handoff: true})
	if err != nil {
		return err
	}
	handler, closeAPI, err := api.FromConfigWith(cfg, pool, reg, logger, api.Options{Store: store, Handoff: w.Handoff()})
	if err != nil {
		return errors.Join(err, w.Close())
	}
	defer closeAPI()
	// The API's address is bound before the worker starts: a process that cannot listen (its
	// address taken) fails without having taken tasks from asynq or led the sweeper.
	srv, err := listenAPI(cfg, handler, reg, logger)
	if err != nil {
		return errors.Join(err, w.Close())
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	workerDone := make(chan error, 1)
	go func() {
		workerDone <- w.Run(ctx)
		stop() // a worker that ended early takes the API down with it
	}()
	logger.Info("worker started", "queue", cfg.Worker.Queue, "concurrency", cfg.Worker.Concurrency)
	err = srv.serveAPI(ctx, o)
	stop()
	return errors.Join(err, <-workerDone)
}

// listenAPI binds api.listen for handler, behind the connection cap; its server ends the open
// event streams when it shuts down.
func listenAPI(cfg *config.Config, handler *api.Server, reg *prometheus.Registry, logger *slog.Logger) (*server, error) {
	srv, err := listen(cfg.API.Listen, handler, cfg, reg, logger, true)
	if err != nil {
		return nil, err
	}
	// Open event streams end at shutdown instead of holding it for its whole timeout.
	srv.srv.RegisterOnShutdown(handler.Shutdown)
	// At the stop, /readyz answers 503 for api.drain_delay before the listener closes.
	srv.drainDelay, srv.drain = cfg.API.DrainDelay, handler.Drain
	if cfg.API.AllowAnonymous {
		logger.Warn("api.allow_anonymous is on: unauthenticated requests act as tenant \"default\" (development only)")
	}
	return srv, nil
}

// serveAPI serves the API bound by listenAPI until ctx ends, telling o.Ready its address first.
func (s *server) serveAPI(ctx context.Context, o Options) error {
	s.log.Info("api listening", "addr", s.ln.Addr().String())
	if o.Ready != nil {
		o.Ready(s.ln.Addr().String())
	}
	return s.serve(ctx)
}
