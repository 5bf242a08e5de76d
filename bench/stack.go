package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/hibiken/asynq"
)

// stackConfig describes an llmq deployment run as child processes.
type stackConfig struct {
	bin        string // directory of the api and worker binaries
	configPath string // the config file every process gets (--config)
	logDir     string // each process's output goes to <logDir>/<name>.log
	apiKey     string // the simulator's key, handed over in simKeyEnv
	redisURL   string // to see the workers register
	queue      string // the config's worker.queue
	// metrics makes each worker serve /metrics on a free port (metricsAddrs).
	metrics bool
	// serve runs `llmq serve` processes (an API and a worker in each) instead of an api and
	// separate workers: the stack's workers are those processes, apiURLs theirs.
	serve bool
	// gomaxprocs is each process's GOMAXPROCS (0: Go's default, the machine's cores).
	gomaxprocs int
}

// processEnv is the environment of the stack's processes: base without what would override
// their config, with the simulator's key and -gomaxprocs (a later value wins over base's).
func (cfg stackConfig) processEnv(base []string) []string {
	extra := []string{simKeyEnv + "=" + cfg.apiKey}
	if cfg.gomaxprocs > 0 {
		extra = append(extra, fmt.Sprintf("GOMAXPROCS=%d", cfg.gomaxprocs))
	}
	return childEnv(base, extra)
}

// gomaxprocsNote is a report's note of -gomaxprocs (nothing at Go's default).
func gomaxprocsNote(n int) []string {
	if n == 0 {
		return nil
	}
	return []string{fmt.Sprintf("Each llmq process ran with GOMAXPROCS=%d (-gomaxprocs), not Go's default (the machine's cores).", n)}
}

// stack is a running api and its workers. Its processes are stopped by stop, by the parent's
// death (Linux: Pdeathsig), and never outlive an error of startStack.
type stack struct {
	cfg          stackConfig
	env          []string
	apiURL       string
	apiURLs      []string // every API of the stack (serve: one per process), apiURL first
	api          *proc
	workers      []*proc
	metricsAddrs []string // the workers' /metrics listeners, with cfg.metrics
	started      int      // worker processes started so far, for their names
}

// startStack starts the api on a free port and n workers, and returns once /healthz answers
// and every worker has registered its asynq server for the queue.
func startStack(ctx context.Context, cfg stackConfig, n int) (*stack, error) {
	st := &stack{cfg: cfg, env: cfg.processEnv(os.Environ())}
	if err := st.start(ctx, n); err != nil {
		_ = st.stop()
		return nil, err
	}
	return st, nil
}

func (st *stack) start(ctx context.Context, n int) error {
	if st.cfg.serve {
		return st.startServe(ctx, n)
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	st.apiURL = "http://" + addr
	st.apiURLs = []string{st.apiURL}
	if st.api, err = startProc(filepath.Join(st.cfg.bin, "api"), "api", st.cfg.logDir, st.env, "--config", st.cfg.configPath, "--listen", addr); err != nil {
		return err
	}
	if err := waitReady(ctx, st.cfg.redisURL, st.cfg.queue, []string{st.apiURL}, nil, st.exited); err != nil {
		return err
	}
	return st.startWorkers(ctx, n)
}

// startServe starts n `llmq serve` processes, each on a free port with its /metrics there, and
// waits until every API answers and every worker has registered.
func (st *stack) startServe(ctx context.Context, n int) error {
	for range n {
		st.started++
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		p, err := startProc(filepath.Join(st.cfg.bin, "llmq"), fmt.Sprintf("serve-%d", st.started), st.cfg.logDir, st.env,
			"serve", "--config", st.cfg.configPath, "--listen", addr)
		if err != nil {
			return err
		}
		st.workers = append(st.workers, p)
		st.apiURLs = append(st.apiURLs, "http://"+addr)
		if st.cfg.metrics {
			st.metricsAddrs = append(st.metricsAddrs, addr)
		}
	}
	st.apiURL = st.apiURLs[0]
	return waitReady(ctx, st.cfg.redisURL, st.cfg.queue, st.apiURLs, st.workerPIDs, st.exited)
}

// startWorkers starts n more workers and waits until each has registered.
func (st *stack) startWorkers(ctx context.Context, n int) error {
	for range n {
		st.started++
		args := []string{"--config", st.cfg.configPath}
		var addr string
		if st.cfg.metrics {
			var err error
			if addr, err = freeAddr(); err != nil {
				return err
			}
			args = append(args, "--metrics-listen", addr)
		}
		p, err := startProc(filepath.Join(st.cfg.bin, "worker"), fmt.Sprintf("worker-%d", st.started), st.cfg.logDir, st.env, args...)
		if err != nil {
			return err
		}
		st.workers = append(st.workers, p)
		if addr != "" {
			st.metricsAddrs = append(st.metricsAddrs, addr)
		}
	}
	return waitReady(ctx, st.cfg.redisURL, st.cfg.queue, nil, st.workerPIDs, st.exited)
}

func (st *stack) workerPIDs() []int {
	pids := make([]int, len(st.workers))
	for i, p := range st.workers {
		pids[i] = p.pid()
	}
	return pids
}

// stopWorkers stops the workers and forgets them.
func (st *stack) stopWorkers() error {
	err := stopAll(st.workers)
	st.workers, st.metricsAddrs = nil, nil
	return err
}

// stop stops every process; it returns the first unclean exit. It may be called again.
func (st *stack) stop() error {
	err := st.stopWorkers()
	if st.api != nil {
		err = errors.Join(err, stopAll([]*proc{st.api}))
		st.api = nil
	}
	return err
}

// exited returns an error naming the first process that ended; nil while all run.
func (st *stack) exited() error {
	if st.api != nil {
		if err := st.api.exited(); err != nil {
			return err
		}
	}
	for _, p := range st.workers {
		if err := p.exited(); err != nil {
			return err
		}
	}
	return nil
}

// waitReady polls, for up to a minute, until every API of apiURLs answers /healthz and every
// pid of pids (nil: none) has registered an asynq server for queue. exited ends the wait with
// its error when a process has ended.
func waitReady(ctx context.Context, redisURL, queue string, apiURLs []string, pids func() []int, exited func() error) error {
	opt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		return fmt.Errorf("parse redis url: %w", err)
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := exited(); err != nil {
			return err
		}
		healthy := 0
		for _, u := range apiURLs {
			if resp, err := hc.Get(u + "/healthz"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					healthy++
				}
			}
		}
		want, registered := 0, 0
		if pids != nil {
			ps := pids()
			want = len(ps)
			if servers, err := insp.Servers(); err == nil {
				for _, s := range servers {
					if s.Queues[queue] > 0 && slices.Contains(ps, s.PID) {
						registered++
					}
				}
			}
		}
		if healthy == len(apiURLs) && registered == want {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready (apis healthy %d/%d, workers registered %d/%d): %w",
				healthy, len(apiURLs), registered, want, context.Cause(ctx))
		case <-tick.C:
		}
	}
}
