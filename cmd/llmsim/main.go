// Command llmsim runs the LLM provider simulator (package internal/llmsim):
// an Anthropic- and OpenAI-compatible HTTP server with per-key request and
// token (input/output tokens per minute) buckets and fault injection, for tests, benchmarks and the local stack.
//
// It prints "llmsim listening on http://ADDR" on stdout once it accepts
// connections, logs to stderr, and shuts down gracefully on SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/signals"
)

// shutdownTimeout bounds the graceful shutdown.
const shutdownTimeout = 5 * time.Second

func main() {
	ctx, stop := signals.Context(context.Background())
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "llmsim:", err)
		os.Exit(1)
	}
}

// run parses args, serves until ctx is done, then shuts down. It prints the
// bound address on stdout once listening and logs to stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("llmsim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		listen      = fs.String("listen", "127.0.0.1:8090", "address to listen on (loopback only unless -allow-remote)")
		allowRemote = fs.Bool("allow-remote", false, "allow a non-loopback -listen address")
		capacity    = fs.Float64("capacity", 0, "token bucket size per API key, in requests (0 = unlimited)")
		rate        = fs.Float64("rate", 0, "bucket refill, tokens per second (required with -capacity)")
		inputTPM    = fs.Int("input-tpm", 0, "input tokens per -token-minute per API key (0 = unlimited)")
		outputTPM   = fs.Int("output-tpm", 0, "output tokens per -token-minute per API key (0 = unlimited)")
		tokenMinute = fs.Duration("token-minute", time.Minute, "refill period of the token buckets (shorten to scale time down)")
		replyTokens = fs.Int("reply-tokens", 0, "every reply is exactly this many output tokens, capped by max_tokens (0 = quote the prompt)")
		contextToks = fs.Int("context-tokens", 0, "the model's context window: a request over it is refused 400 in the provider's words (0 = none)")
		streamTPS   = fs.Float64("stream-tokens-per-second", 0, "pace of streamed answers, in content tokens per second (0 = as fast as possible)")
		latency     = fs.Duration("latency", 0, "delay before every answer")
		jitter      = fs.Duration("latency-jitter", 0, "extra uniform random delay U(0, jitter)")
		seed        = fs.Uint64("seed", 1, "seed of the random source (jitter, error rate)")
		logLevel    = fs.String("log-level", "info", "debug logs one line per answer: debug|info|warn|error")
		faults      llmsim.Faults
		batch       llmsim.BatchConfig
	)
	fs.DurationVar(&batch.ProcessingDelay, "batch-delay", 0, "time from a batch's creation to its end (Message Batches, OpenAI Batch)")
	fs.DurationVar(&batch.Window, "batch-window", 24*time.Hour, "a batch that would take longer ends then with every request expired")
	fs.BoolVar(&faults.SpendCap, "spend-cap", false, "answer every request 429 without retry-after (spend cap)")
	fs.Float64Var(&faults.ErrorRate, "error-rate", 0, "fraction of requests answered with -error-status")
	fs.IntVar(&faults.ErrorStatus, "error-status", 500, "status of -error-rate errors")
	fs.IntVar(&faults.FailNext, "fail-next", 0, "answer the next N requests with -fail-next-status")
	fs.IntVar(&faults.FailNextStatus, "fail-next-status", 500, "status of -fail-next errors")
	fs.DurationVar(&faults.OverloadedFor, "overloaded-for", 0, "answer overloaded (529/503) for this long after start")
	fs.StringVar(&faults.BadRequestMarker, "bad-request-marker", llmsim.DefaultBadRequestMarker, "a request body containing this answers 400")
	fs.BoolVar(&faults.Hang, "hang", false, "never answer until the client gives up")
	fs.DurationVar(&faults.SlowFirstByte, "slow-first-byte", 0, "send headers, then wait this long before the body")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("-log-level: %w", err)
	}
	if !*allowRemote {
		if err := requireLoopback(*listen); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg := llmsim.Config{
		Capacity:              *capacity,
		RefillPerSecond:       *rate,
		InputTokensPerMinute:  *inputTPM,
		OutputTokensPerMinute: *outputTPM,
		TokenMinute:           *tokenMinute,
		ReplyTokens:           *replyTokens,
		ContextTokens:         *contextToks,
		StreamTokensPerSecond: *streamTPS,
		Latency:               *latency,
		LatencyJitter:         *jitter,
		Faults:                faults,
		Batch:                 batch,
		Rand:                  rand.New(rand.NewPCG(*seed, *seed)).Float64,
		Logger:                logger,
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("invalid flags: %w", err)
	}

	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{
		Handler:           llmsim.New(cfg),
		ReadHeaderTimeout: 10 * time.Second,
		// Request contexts end with ctx, so hung and delayed answers stop at
		// shutdown instead of holding it up.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	logger.Info("llmsim listening", slog.String("addr", ln.Addr().String()),
		slog.Float64("capacity", cfg.Capacity), slog.Float64("rate", cfg.RefillPerSecond),
		slog.Int("input_tpm", cfg.InputTokensPerMinute), slog.Int("output_tpm", cfg.OutputTokensPerMinute),
		slog.Duration("token_minute", cfg.TokenMinute), slog.Int("reply_tokens", cfg.ReplyTokens),
		slog.Int("context_tokens", cfg.ContextTokens))
	fmt.Fprintf(stdout, "llmsim listening on http://%s\n", ln.Addr())

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutdown: %w", err)
	}
	<-serveErr // http.ErrServerClosed
	logger.Info("llmsim stopped")
	return nil
}

// requireLoopback refuses addresses other people could reach: an empty host
// (all interfaces), a non-loopback IP, or a host name other than localhost.
func requireLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("-listen %s is not a loopback address; pass -allow-remote to serve it", addr)
}
