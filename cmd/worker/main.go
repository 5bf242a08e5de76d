// Command worker executes llmq jobs: it takes tasks from asynq, calls the provider inside the
// shared limits, and stores the outcome in Postgres. Stateless; run any number.
package main

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
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/worker"
	"github.com/llmq/llmq/migrations"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", os.Getenv(config.EnvConfig), "config file (env "+config.EnvConfig+")")
	metricsListen := fs.String("metrics-listen", "", "override worker.metrics_listen (\"off\" disables)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.Load(*cfgPath, nil)
	if err != nil {
		return err
	}
	if *metricsListen != "" {
		cfg.Worker.MetricsListen = *metricsListen
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil)).With("process", "worker", "pid", os.Getpid())

	pool, err := migrations.OpenWait(ctx, cfg.DatabaseURL, func(err error, wait time.Duration) {
		logger.Warn("postgres not reachable yet; trying again", "error", err, "retry_in", wait.String())
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	w, err := worker.New(ctx, cfg, pool, worker.Options{Logger: logger, Registerer: reg})
	if err != nil {
		return err
	}
	if cfg.Worker.MetricsListen != "off" {
		ln, err := net.Listen("tcp", cfg.Worker.MetricsListen)
		if err != nil {
			return fmt.Errorf("listen on %s for metrics: %w", cfg.Worker.MetricsListen, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		serverCfg := httpserve.FromConfig(cfg.API) // the api section's timeouts apply to every server
		serverCfg.ErrorLog = logger
		srv := httpserve.NewServer(mux, serverCfg)
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				logger.Error("metrics server", "error", err)
			}
		}()
		defer srv.Close()
	}
	logger.Info("worker started", "queue", cfg.Worker.Queue, "concurrency", cfg.Worker.Concurrency)
	return w.Run(ctx)
}
