package signals

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv makes the test binary, run again by TestContext_SecondSignalEndsAHungShutdown,
// play a command whose shutdown hangs.
const helperEnv = "LLMQ_SIGNALS_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		hangingCommand()
		return
	}
	os.Exit(m.Run())
}

// hangingCommand announces it is running, waits for its shutdown context, announces that, and
// then never returns: only a signal's default action ends it.
func hangingCommand() {
	ctx, stop := Context(context.Background())
	defer stop()
	os.Stdout.WriteString("running\n")
	<-ctx.Done()
	os.Stdout.WriteString("stopping\n")
	select {}
}

// ignored reports whether this process was started ignoring sig (its SigIgn mask in /proc),
// which a child inherits: a shell starts background jobs ignoring SIGINT.
func ignored(t *testing.T, sig syscall.Signal) bool {
	t.Helper()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status to read the ignored signals from: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if mask, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
			if err != nil {
				t.Fatalf("SigIgn %q: %v", mask, err)
			}
			return bits&(1<<(uint(sig)-1)) != 0
		}
	}
	t.Fatal("no SigIgn line in /proc/self/status")
	return false
}

func TestContext_SecondSignalEndsAHungShutdown(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			if ignored(t, sig) {
				t.Skipf("this test process was started ignoring %v, and so would its helper", sig)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"=1")
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			lines := make(chan string)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			next := func(want string) {
				t.Helper()
				select {
				case got := <-lines:
					if got != want {
						t.Fatalf("helper printed %q, want %q", got, want)
					}
				case <-ctx.Done():
					t.Fatalf("helper never printed %q", want)
				}
			}
			next("running")
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			next("stopping") // the first signal is a graceful stop: the process goes on
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			for range lines {
			}
			err = cmd.Wait()
			if ctx.Err() != nil {
				t.Fatalf("the second %v did not end the hung shutdown (killed at the test's deadline)", sig)
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("helper ended with %v, want an exit by %v", err, sig)
			}
			if ws, ok := exit.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != sig {
				t.Fatalf("helper ended with %v, want an exit by %v", err, sig)
			}
		})
	}
}
