package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/hibiken/asynq"
)

// httpFloorCmd is the hidden command that runs the floor over HTTP as a process of its own (for
// `bench instructions`, which counts one process's instructions): its API (POST /jobs, GET
// /healthz) and its asynq server, on a database holding bench_jobs and a queue the bench made.
const httpFloorCmd = "httpfloor-serve"

// floorProcConfig is the command line of the floor's process.
type floorProcConfig struct {
	dbURL, redisURL, queue, simURL, listen string
	conns, concurrency                     int
}

// args is cfg as the floor process's command line.
func (cfg floorProcConfig) args() []string {
	return []string{httpFloorCmd, "-database-url", cfg.dbURL, "-redis-url", cfg.redisURL, "-queue", cfg.queue,
		"-sim-url", cfg.simURL, "-listen", cfg.listen, "-conns", strconv.Itoa(cfg.conns), "-concurrency", strconv.Itoa(cfg.concurrency)}
}

// parseFloorProc parses the floor process's flags; the URLs, the queue and the address are
// required.
func parseFloorProc(args []string, stderr io.Writer) (floorProcConfig, error) {
	var cfg floorProcConfig
	fs := newFlagSet(httpFloorCmd, stderr)
	fs.StringVar(&cfg.dbURL, "database-url", "", "the database holding bench_jobs")
	fs.StringVar(&cfg.redisURL, "redis-url", "", "asynq's Redis")
	fs.StringVar(&cfg.queue, "queue", "", "the asynq queue")
	fs.StringVar(&cfg.simURL, "sim-url", "", "the provider")
	fs.StringVar(&cfg.listen, "listen", "", "host:port of POST /jobs and GET /healthz")
	fs.intAtLeast(&cfg.conns, "conns", 16, 2, "Postgres pool size")
	fs.intAtLeast(&cfg.concurrency, "concurrency", 200, 1, "asynq's Concurrency")
	fs.check(func() error {
		for _, name := range []string{"database-url", "redis-url", "queue", "sim-url", "listen"} {
			if fs.Lookup(name).Value.String() == "" {
				return fmt.Errorf("-%s is required", name)
			}
		}
		return nil
	})
	return cfg, fs.parse(args)
}

// serveHTTPFloor runs the floor over HTTP until ctx ends, then shuts its server down.
func serveHTTPFloor(ctx context.Context, cfg floorProcConfig) error {
	pool, err := openPool(ctx, cfg.dbURL, cfg.conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	opt, rdb, err := redisFor(ctx, cfg.redisURL)
	if err != nil {
		return err
	}
	defer rdb.Close()
	client := asynq.NewClient(opt)
	defer client.Close()
	hc := providerClient(cfg.concurrency)
	defer hc.CloseIdleConnections()
	s := &httpFloorSystem{floorBase: floorBase{pool: pool, client: client, queue: cfg.queue, opt: opt}, simURL: cfg.simURL, hc: hc}
	srv := asynq.NewServer(opt, asynqServerConfig(cfg.queue, cfg.concurrency)) // its warnings on stderr, the process's log
	if err := srv.Start(asynq.HandlerFunc(s.handle)); err != nil {
		return fmt.Errorf("start asynq server: %w", err)
	}
	defer srv.Shutdown()
	mux := healthMux()
	mux.HandleFunc("POST /jobs", s.serveSubmit)
	return serveUntilDone(ctx, cfg.listen, mux)
}

// hiddenProcess returns the main of a hidden command (the River over HTTP row's processes, the
// floor's); ok is false when name is none.
func hiddenProcess(name string) (main func(ctx context.Context, args []string, stderr io.Writer) error, ok bool) {
	if name != httpFloorCmd {
		return riverProcess(name)
	}
	return func(ctx context.Context, args []string, stderr io.Writer) error {
		cfg, err := parseFloorProc(args, stderr)
		if err != nil {
			return err
		}
		err = serveHTTPFloor(ctx, cfg)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		return err
	}, true
}
