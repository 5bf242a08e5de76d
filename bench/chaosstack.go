package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// chaosSlot keeps one llmq process running, the way a supervisor (systemd, Kubernetes) would:
// it restarts the process when it exits on its own (after a short back-off) and, on request,
// SIGKILLs it and starts a new one at once. Each process has its own log,
// <logDir>/<name>.<generation>.log.
type chaosSlot struct {
	name   string
	binary string
	args   []string
	env    []string
	logDir string

	killReq chan chan time.Time // SIGKILL and restart; the reply is the restart time
	quit    chan struct{}
	done    chan struct{}

	mu    sync.Mutex
	cur   *proc       // the running process; nil between processes
	exits []chaosExit // exits we did not cause
	gens  int
}

// chaosExit is a process that ended without being asked to.
type chaosExit struct {
	name string
	at   time.Time
	err  error
	tail string // the end of its log
}

// chaosRestartBackoff is the wait before a process that exited on its own is started again.
const chaosRestartBackoff = 500 * time.Millisecond

func newChaosSlot(name, binary, logDir string, env []string, args ...string) *chaosSlot {
	return &chaosSlot{name: name, binary: binary, args: args, env: env, logDir: logDir,
		killReq: make(chan chan time.Time), quit: make(chan struct{}), done: make(chan struct{})}
}

// start runs the slot until stop.
func (s *chaosSlot) start() { go s.run() }

func (s *chaosSlot) run() {
	defer close(s.done)
	var reply chan time.Time // a kill waiting for its restart time
	for {
		s.mu.Lock()
		s.gens++
		name := fmt.Sprintf("%s.%d", s.name, s.gens)
		s.mu.Unlock()
		p, err := startProc(s.binary, name, s.logDir, s.env, s.args...)
		if reply != nil {
			reply <- time.Now()
			reply = nil
		}
		if err != nil {
			s.recordExit(chaosExit{name: name, at: time.Now(), err: err})
			if !s.backoff() {
				return
			}
			continue
		}
		s.mu.Lock()
		s.cur = p
		s.mu.Unlock()
		select {
		case <-s.quit:
			terminate(p)
			s.setCur(nil)
			return
		case reply = <-s.killReq:
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
			_ = p.log.Close()
			s.setCur(nil)
		case <-p.done:
			_ = p.log.Close()
			s.setCur(nil)
			s.recordExit(chaosExit{name: name, at: time.Now(), err: p.err, tail: tail(p.logPath, 5)})
			if !s.backoff() {
				return
			}
		}
	}
}

func (s *chaosSlot) setCur(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = p
}

func (s *chaosSlot) recordExit(e chaosExit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.exits = append(s.exits, e)
}

// backoff waits before a restart; false when the slot is being stopped.
func (s *chaosSlot) backoff() bool {
	t := time.NewTimer(chaosRestartBackoff)
	defer t.Stop()
	select {
	case <-s.quit:
		return false
	case <-t.C:
		return true
	}
}

// kill SIGKILLs the slot's process and returns when (and whether) its successor started. It
// gives up when the slot is between processes for longer than a few seconds.
func (s *chaosSlot) kill(ctx context.Context) (time.Time, error) {
	reply := make(chan time.Time, 1)
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case s.killReq <- reply:
	case <-t.C:
		return time.Time{}, fmt.Errorf("%s has no running process to kill", s.name)
	case <-ctx.Done():
		return time.Time{}, context.Cause(ctx)
	}
	select {
	case at := <-reply:
		return at, nil
	case <-ctx.Done():
		return time.Time{}, context.Cause(ctx)
	}
}

// pid is the running process's pid, 0 between processes.
func (s *chaosSlot) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return 0
	}
	return s.cur.cmd.Process.Pid
}

// unexpectedExits returns the exits the slot did not cause.
func (s *chaosSlot) unexpectedExits() []chaosExit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]chaosExit(nil), s.exits...)
}

// stop ends the slot: SIGTERM to its process, SIGKILL after 20 s. Idempotent.
func (s *chaosSlot) stop() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
}

// terminate sends SIGTERM, waits up to 20 s (a worker drains for up to 10 s), then kills.
func terminate(p *proc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(20 * time.Second)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	_ = p.log.Close()
}

// stopSlots stops every slot at once and waits for all.
func stopSlots(slots []*chaosSlot) {
	var wg sync.WaitGroup
	for _, s := range slots {
		wg.Go(s.stop)
	}
	wg.Wait()
}

// waitChaosReady returns once every API answers /healthz and every worker slot's current
// process has registered its asynq server for queue. It fails at once when a process of
// watched exits on its own.
func waitChaosReady(ctx context.Context, apiURLs []string, workers, watched []*chaosSlot, redisURL, queue string) error {
	opt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		return fmt.Errorf("parse redis url: %w", err)
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	hc := &http.Client{Timeout: time.Second}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, s := range watched {
			if exits := s.unexpectedExits(); len(exits) > 0 {
				e := exits[0]
				return fmt.Errorf("%s exited at start-up (%v); end of its log:\n%s", e.name, e.err, e.tail)
			}
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
		registered := 0
		if servers, err := insp.Servers(); err == nil {
			pids := map[int]bool{}
			for _, s := range servers {
				if s.Queues[queue] > 0 {
					pids[s.PID] = true
				}
			}
			for _, w := range workers {
				if pid := w.pid(); pid != 0 && pids[pid] {
					registered++
				}
			}
		}
		if healthy == len(apiURLs) && registered == len(workers) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stack not ready (apis healthy %d/%d, workers registered %d/%d): %w",
				healthy, len(apiURLs), registered, len(workers), context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// startPrivateRedis starts a redis-server of its own on a free port, without persistence, so
// that the run may FLUSHALL it. It returns its URL and a function that kills it.
func startPrivateRedis(ctx context.Context, binary, dir string) (string, func(), error) {
	addr, err := freeAddr()
	if err != nil {
		return "", nil, err
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, fmt.Errorf("free address %s: %w", addr, err)
	}
	logf, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		return "", nil, fmt.Errorf("create redis log: %w", err)
	}
	cmd := exec.Command(binary, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	setChildAttrs(cmd)
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", nil, fmt.Errorf("start %s (pass -redis-server): %w", binary, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
	}
	redisURL := "redis://" + addr + "/0"
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(ctx).Err() != nil {
		select {
		case <-exited:
			stop()
			return "", nil, fmt.Errorf("redis-server exited at start-up; end of its log:\n%s", tail(logf.Name(), 10))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return "", nil, errors.New("private redis-server did not answer PING within 10 s")
		}
		time.Sleep(20 * time.Millisecond) // polling a process start-up: there is nothing to wait on
	}
	return redisURL, stop, nil
}
