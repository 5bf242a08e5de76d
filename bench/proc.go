package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/llmq/llmq/internal/config"
)

// simKeyEnv is the environment variable through which the children get the simulator's key.
const simKeyEnv = "LLMQ_BENCH_SIM_KEY"

// stopGrace is how long a process gets to end after SIGTERM (a worker drains for up to 10 s)
// before it is killed.
const stopGrace = 20 * time.Second

// proc is one child process, its stdout and stderr in its own log file.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	done    chan struct{} // closed when the process has exited
	err     error         // its exit, valid once done is closed
}

// startProc starts binary with its output in <logDir>/<name>.log.
func startProc(binary, name, logDir string, env []string, args ...string) (*proc, error) {
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log for %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	setChildAttrs(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, logPath: logPath, log: f, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited returns an error naming the process and quoting the end of its log once it has
// ended; nil while it runs.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited early (%v); end of %s:\n%s", p.name, p.err, p.logPath, tail(p.logPath, 15))
	default:
		return nil
	}
}

// stopAll sends SIGTERM to every process, waits up to stopGrace for them, then kills what is
// left. It returns the exits other than by that SIGTERM.
func stopAll(procs []*proc) error {
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(stopGrace)
	var errs []error
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("%s did not stop within %s; killed", p.name, stopGrace))
		}
		if p.err != nil && !isTermination(p.err) {
			errs = append(errs, fmt.Errorf("%s: %w", p.name, p.err))
		}
	}
	return errors.Join(errs...)
}

// isTermination reports whether a process ended by our SIGTERM.
func isTermination(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}

// childEnv is base without the variables that would override the config file, plus extra.
func childEnv(base, extra []string) []string {
	out := slices.DeleteFunc(slices.Clone(base), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == config.EnvConfig || k == config.EnvDatabaseURL || k == config.EnvRedisURL || k == simKeyEnv
	})
	return append(out, extra...)
}

// tail returns the last n lines of the file at path (or why it cannot).
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if err := sc.Err(); err != nil {
		lines = append(lines, "(the rest is unreadable: "+err.Error()+")")
	}
	return strings.Join(lines, "\n")
}
