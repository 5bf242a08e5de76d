package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// The processes of the "River over HTTP" row are this binary run again with a hidden command:
// river-api (POST /jobs inserts a River job) and river-worker (a River client whose worker
// sends the job's request to the provider and records the answer with river.RecordOutput). Each
// serves GET /healthz on -listen once it is ready, and stops on SIGTERM.
const (
	riverAPICmd    = "river-api"
	riverWorkerCmd = "river-worker"
)

// riverHTTPKey is the API key the River workers' provider calls carry (llmsim wants one).
const riverHTTPKey = "sk-bench-river"

// riverProcConfig is the command line of a River process.
type riverProcConfig struct {
	dbURL  string // the row's database, River's tables migrated
	listen string // host:port of /healthz (and, for the api, POST /jobs)
	conns  int    // the process's Postgres pool
	// The worker's: the provider, River's MaxWorkers, FetchCooldown and FetchPollInterval.
	simURL        string
	maxWorkers    int
	fetchCooldown time.Duration
	fetchPoll     time.Duration
}

// args is cfg as the command line of process cmd (riverAPICmd or riverWorkerCmd).
func (cfg riverProcConfig) args(cmd string) []string {
	out := []string{cmd, "-database-url", cfg.dbURL, "-listen", cfg.listen, "-conns", strconv.Itoa(cfg.conns)}
	if cmd == riverWorkerCmd {
		out = append(out, "-sim-url", cfg.simURL, "-max-workers", strconv.Itoa(cfg.maxWorkers),
			"-fetch-cooldown", cfg.fetchCooldown.String(), "-fetch-poll", cfg.fetchPoll.String())
	}
	return out
}

// parseRiverProc parses the flags of process cmd; every flag of that process is required.
func parseRiverProc(cmd string, args []string, stderr io.Writer) (riverProcConfig, error) {
	var cfg riverProcConfig
	fs := newFlagSet(cmd, stderr)
	fs.StringVar(&cfg.dbURL, "database-url", "", "the row's database")
	fs.StringVar(&cfg.listen, "listen", "", "host:port of /healthz")
	fs.intAtLeast(&cfg.conns, "conns", 16, 2, "Postgres pool size")
	required := []string{"database-url", "listen"}
	if cmd == riverWorkerCmd {
		fs.StringVar(&cfg.simURL, "sim-url", "", "the provider")
		fs.intAtLeast(&cfg.maxWorkers, "max-workers", 200, 1, "River's MaxWorkers")
		fs.positiveDuration(&cfg.fetchCooldown, "fetch-cooldown", riverFetchCooldown, "River's FetchCooldown")
		fs.positiveDuration(&cfg.fetchPoll, "fetch-poll", riverFetchPoll, "River's FetchPollInterval")
		required = append(required, "sim-url")
	}
	fs.check(func() error {
		for _, name := range required {
			if fs.Lookup(name).Value.String() == "" {
				return fmt.Errorf("-%s is required", name)
			}
		}
		return nil
	})
	return cfg, fs.parse(args)
}

// riverProcess returns the main of the hidden command name; ok is false when name is none.
func riverProcess(name string) (main func(ctx context.Context, args []string, stderr io.Writer) error, ok bool) {
	var serve func(context.Context, riverProcConfig, *slog.Logger) error
	switch name {
	case riverAPICmd:
		serve = serveRiverAPI
	case riverWorkerCmd:
		serve = serveRiverWorker
	default:
		return nil, false
	}
	return func(ctx context.Context, args []string, stderr io.Writer) error {
		cfg, err := parseRiverProc(name, args, stderr)
		if err != nil {
			return err
		}
		return serve(ctx, cfg, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	}, true
}

// riverHTTPArgs is the River job of the row: the provider request as the client sent it.
type riverHTTPArgs struct {
	Request json.RawMessage `json:"request"`
}

// Kind implements river.JobArgs.
func (riverHTTPArgs) Kind() string { return "bench_river_http" }

// openPool opens a pool of conns connections on the database at dbURL (for the processes the
// bench binary runs itself: River over HTTP's, the floor's).
func openPool(ctx context.Context, dbURL string, conns int) (*pgxpool.Pool, error) {
	pcfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, fmt.Errorf("parse -database-url: %w", err)
	}
	pcfg.MaxConns = int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("open postgres pool: %w", err)
	}
	return pool, nil
}

// serveRiverAPI is the API: POST /jobs with {"request": {...}} inserts a River job holding the
// request and answers 202 {"id": "<River's job id>"}.
func serveRiverAPI(ctx context.Context, cfg riverProcConfig, logger *slog.Logger) error {
	pool, err := openPool(ctx, cfg.dbURL, cfg.conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: logger}) // insert-only
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	mux := healthMux()
	mux.HandleFunc("POST /jobs", func(w http.ResponseWriter, r *http.Request) {
		var args riverHTTPArgs
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&args); err != nil || len(args.Request) == 0 {
			http.Error(w, `want {"request": {...}}`, http.StatusBadRequest)
			return
		}
		res, err := client.Insert(r.Context(), args, nil)
		if err != nil {
			http.Error(w, "insert: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintf(w, `{"id":"%d"}`, res.Job.ID)
	})
	return serveUntilDone(ctx, cfg.listen, mux)
}

// riverHTTPWorker sends a job's request to the provider and records the answer as the job's
// output.
type riverHTTPWorker struct {
	river.WorkerDefaults[riverHTTPArgs]
	hc     *http.Client
	simURL string
}

// Work implements river.Worker.
func (w *riverHTTPWorker) Work(ctx context.Context, job *river.Job[riverHTTPArgs]) error {
	answer, err := callProvider(ctx, w.hc, w.simURL, job.Args.Request)
	if err != nil {
		return err
	}
	return river.RecordOutput(ctx, json.RawMessage(answer))
}

// callProvider POSTs request to the provider's /v1/messages and returns its answer; anything
// but a 200 is an error.
func callProvider(ctx context.Context, hc *http.Client, simURL string, request []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, simURL+"/v1/messages", bytes.NewReader(request))
	if err != nil {
		return nil, fmt.Errorf("build provider request: %w", err)
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-api-key", riverHTTPKey)
	req.Header.Set("anthropic-version", "2023-06-01")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("call provider: %w", err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read provider answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("provider answered %d: %s", resp.StatusCode, bytes.TrimSpace(answer))
	}
	return answer, nil
}

// providerClient is the workers' HTTP client: net/http's, keeping an idle connection per
// concurrent job (the default transport keeps 2 per host, and 200 jobs would open a connection
// per call).
func providerClient(maxWorkers int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = maxWorkers, maxWorkers
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// serveRiverWorker runs a River client working the default queue with riverHTTPWorker until
// ctx ends, then stops it gracefully (jobs in hand finish).
func serveRiverWorker(ctx context.Context, cfg riverProcConfig, logger *slog.Logger) error {
	pool, err := openPool(ctx, cfg.dbURL, cfg.conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	hc := providerClient(cfg.maxWorkers)
	defer hc.CloseIdleConnections()
	workers := river.NewWorkers()
	if err := river.AddWorkerSafely(workers, &riverHTTPWorker{hc: hc, simURL: cfg.simURL}); err != nil {
		return fmt.Errorf("river worker: %w", err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.maxWorkers}},
		Workers:           workers,
		FetchCooldown:     cfg.fetchCooldown,
		FetchPollInterval: cfg.fetchPoll,
		Logger:            logger,
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	// Not ctx: its end would cancel the jobs in hand; Stop below lets them finish.
	if err := client.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("start river: %w", err)
	}
	serveErr := serveUntilDone(ctx, cfg.listen, healthMux())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return errors.Join(serveErr, client.Stop(sctx))
}

// healthMux answers GET /healthz with 200.
func healthMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	return mux
}

// serveUntilDone serves h on addr until ctx ends, then shuts the server down.
func serveUntilDone(ctx context.Context, addr string, h http.Handler) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve on %s: %w", addr, err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down %s: %w", addr, err)
	}
	return nil
}
