package e2e_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/api"
	"github.com/llmq/llmq/internal/operator"
	"github.com/llmq/llmq/internal/tenant"
)

// TestConsole_Browser runs the console's browser suite (test/browser/console.test.mjs:
// playwright-core driving Debian's Chromium, both installed by scripts/browser.sh) against a
// stack of its own: log in (a tenant token refused), the overview's counts, a dead letter
// appearing live when a spend cap hits, its attempts, resuming the paused credential while a
// waiting job's page goes live to succeeded, retrying the dead letter after a confirmation that
// names the count, creating and revoking a tenant, an action without the CSRF token refused,
// an unknown job's message, the audit log, logout. It also measures the overview's first load.
// LLMQ_SCREENSHOTS=docs/console (from the repository root) writes the README's screenshots.
func TestConsole_Browser(t *testing.T) {
	t.Parallel()
	script, err := filepath.Abs(filepath.Join(repoRoot, "scripts", "browser.sh"))
	require.NoError(t, err)
	runBrowser(t, 10*time.Minute, nil, script) // apt-get chromium and npm ci when missing or stale

	b := setup(t, setupOpts{})
	ctx := context.Background()
	pool, err := openPool(ctx, b.dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// The console is served by an API of its own, outside the OpenAPI check of the harness's
	// (the console's routes are not part of the API's contract), reading the worker's keys.
	srv, closeAPI, err := api.FromConfigWith(b.cfg, pool, prometheus.NewRegistry(), nil, api.Options{RedisPrefix: b.prefix})
	require.NoError(t, err)
	t.Cleanup(func() { _ = closeAPI() })
	hs := httptest.NewServer(srv)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
	})
	_, opToken, err := operator.NewStore(pool, nil).Create(ctx, "alice")
	require.NoError(t, err)
	_, tenantToken, err := tenant.NewStore(pool, nil).Create(ctx, "someone", nil)
	require.NoError(t, err)

	env := []string{"LLMQ_CONSOLE_URL=" + hs.URL, "LLMQ_API=" + b.apiURL, "LLMQ_SIM=" + b.simURL,
		"LLMQ_OPERATOR_TOKEN=" + opToken, "LLMQ_TENANT_TOKEN=" + tenantToken}
	if dir := os.Getenv("LLMQ_SCREENSHOTS"); dir != "" {
		abs, err := filepath.Abs(filepath.Join(repoRoot, dir))
		require.NoError(t, err)
		env = append(env, "LLMQ_SCREENSHOTS="+abs)
	}
	out := runBrowser(t, 3*time.Minute, env, script, "console.test.mjs")
	t.Logf("browser suite:\n%s", out)
	require.True(t, strings.HasSuffix(strings.TrimSpace(out), "step: done"), out)
}

// runBrowser runs a program in test/browser with env added and returns its standard output; it
// fails the test on a failure or after timeout, killing the program's process group.
func runBrowser(t *testing.T, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = filepath.Join(repoRoot, "test", "browser"), append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "%s did not end within %s; output:\n%s%s", name, timeout, stdout.String(), stderr.String())
	require.NoError(t, err, "%s: %s%s", name, stdout.String(), stderr.String())
	return stdout.String()
}
