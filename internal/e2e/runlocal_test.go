package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRunLocal_RefusesATakenPort: `make run` (scripts/run-local.sh) while another one runs
// started the simulator (which failed to bind), said "llmq is up" because the other instance's
// API answered, then failed and exited. It refuses up front now, naming the port, before it
// starts anything. The script runs in a copy of the tree whose configs/local.yaml names free
// ports (one of them held by the test), with stubs for services.sh and the binaries that record
// being started: the test binds neither 8080 nor 8090, and starts nothing.
func TestRunLocal_RefusesATakenPort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		held string // which port the test holds
	}{
		{"API", "API"},
		{"Simulator", "simulator"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			held, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			t.Cleanup(func() { _ = held.Close() })
			free := freePort(t)
			heldPort := held.Addr().(*net.TCPAddr).Port
			apiPort, simPort := heldPort, free
			if tc.held == "simulator" {
				apiPort, simPort = free, heldPort
			}
			root := runLocalTree(t, apiPort, simPort)

			cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "run-local.sh"))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.True(t, errors.As(err, &exit), "the script exited %v: %s", err, out)
			require.Equal(t, 1, exit.ExitCode(), "%s", out)
			require.Contains(t, string(out), fmt.Sprintf("port %d (the %s's) is already in use", heldPort, tc.held))
			require.Contains(t, string(out), "another `make run`")
			require.NotContains(t, string(out), "llmq is up")
			started, err := filepath.Glob(filepath.Join(root, "started-*"))
			require.NoError(t, err)
			require.Empty(t, started, "nothing starts when a port is taken")
		})
	}
}

// TestRunLocal_NotUpIsNotUp: a stack whose API never answers (here, stubs that exit at once; a
// failed migration, say) is not announced as up: the script says so and exits 1, without
// waiting out its 10 s once a process has exited.
func TestRunLocal_NotUpIsNotUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	apiPort := freePort(t)
	root := runLocalTree(t, apiPort, freePort(t))
	out, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "run-local.sh")).CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "the script exited %v: %s", err, out)
	require.Equal(t, 1, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), fmt.Sprintf("llmq did not come up on :%d", apiPort))
	require.NotContains(t, string(out), "llmq is up")
}

// freePort is a port nothing listened on a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// runLocalTree is a temporary copy of what scripts/run-local.sh uses: the script itself, a
// configs/local.yaml on apiPort and simPort, and stubs of scripts/services.sh, bin/llmsim and
// bin/llmq, each of which only leaves a started-NAME file at the tree's root.
func runLocalTree(t *testing.T, apiPort, simPort int) string {
	t.Helper()
	root := t.TempDir()
	script, err := os.ReadFile(filepath.Join("..", "..", "scripts", "run-local.sh"))
	require.NoError(t, err)
	config := "database_url: postgres://postgres@127.0.0.1:5432/llmq?sslmode=disable\n" +
		"api:\n  listen: 127.0.0.1:" + strconv.Itoa(apiPort) + "\n" +
		"credentials:\n  - name: default\n    provider: anthropic\n    base_url: http://127.0.0.1:" + strconv.Itoa(simPort) + "\n"
	files := map[string]string{"scripts/run-local.sh": string(script), "configs/local.yaml": config}
	for _, stub := range []string{"scripts/services.sh", "bin/llmsim", "bin/llmq"} {
		files[stub] = "#!/usr/bin/env bash\ntouch \"$(dirname \"$0\")/../started-" + filepath.Base(stub) + "\"\n"
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o755))
	}
	return root
}
