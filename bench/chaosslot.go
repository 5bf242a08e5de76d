package main

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"
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
			_ = stopAll([]*proc{p})
			s.setCur(nil)
			return
		case reply = <-s.killReq:
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
			s.setCur(nil)
		case <-p.done:
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
	return s.cur.pid()
}

// unexpectedExits returns the exits the slot did not cause.
func (s *chaosSlot) unexpectedExits() []chaosExit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]chaosExit(nil), s.exits...)
}

// stop ends the slot: SIGTERM to its process, SIGKILL after stopGrace. Idempotent.
func (s *chaosSlot) stop() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
}

// stopSlots stops every slot at once and waits for all.
func stopSlots(slots []*chaosSlot) {
	var wg sync.WaitGroup
	for _, s := range slots {
		wg.Go(s.stop)
	}
	wg.Wait()
}
