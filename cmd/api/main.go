// Command api serves llmq's HTTP API: submit and poll jobs. It is stateless; run any number.
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

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/migrations"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}

// run starts the API and serves until ctx ends. ready, when set, receives the bound address.
func run(ctx context.Context, args []string, stderr io.Writer, ready func(addr string)) error {
	fs := flag.NewFlagSet("api", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", os.Getenv(config.EnvConfig), "config file (env "+config.EnvConfig+")")
	listen := fs.String("listen", "", "override api.listen")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := config.LoadWithoutSecrets(*cfgPath, nil) // the API never calls a provider
	if err != nil {
		return err
	}
	if *listen != "" {
		cfg.API.Listen = *listen
	}
	logger := slog.New(slog.NewJSONHandler(stderr, nil)).With("process", "api")
	if cfg.API.AllowAnonymous {
		logger.Warn("api.allow_anonymous is on: unauthenticated requests act as tenant \"default\" (development only)")
	}

	pool, err := migrations.OpenWait(ctx, cfg.DatabaseURL, func(err error, wait time.Duration) {
		logger.Warn("postgres not reachable yet; trying again", "error", err, "retry_in", wait.String())
	})
	if err != nil {
		return err
	}
	defer pool.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	handler, closeAPI, err := api.FromConfig(cfg, pool, reg, logger)
	if err != nil {
		return err
	}
	defer closeAPI()

	ln, err := net.Listen("tcp", cfg.API.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.API.Listen, err)
	}
	// Hostile clients: timeouts on every read and write, a cap on open connections.
	ln = httpserve.LimitListener(ln, cfg.API.MaxConnections, httpserve.NewMetrics(reg))
	serverCfg := httpserve.FromConfig(cfg.API)
	serverCfg.ErrorLog = logger
	srv := httpserve.NewServer(handler, serverCfg)
	// Open event streams end at shutdown instead of holding it for its whole timeout.
	srv.RegisterOnShutdown(handler.Shutdown)
	logger.Info("api listening", "addr", ln.Addr().String())
	if ready != nil {
		ready(ln.Addr().String())
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
