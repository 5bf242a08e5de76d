package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/llmsim"
	"github.com/llmq/llmq/internal/tenant"
)

// TestDocs_EventSourceExample runs docs/api.md's JavaScript example (Browsers) as written, with Node and
// the real npm eventsource package (test/js, installed by scripts/js.sh), against stacks of its
// own. An anonymous job: it submits, follows the job through its signed events_url, prints each
// event, and must end by itself: after the terminal event the EventSource reconnects, gets 204
// and closes, so Node has nothing left to wait for. A tenant's job (LLMQ_TOKEN) whose tenant is
// revoked while its page listens: the page is told why (the refused event), then closes (the
// reconnect is answered 403).
func TestDocs_EventSourceExample(t *testing.T) {
	t.Parallel()
	md, err := os.ReadFile(filepath.Join(repoRoot, "docs", "api.md"))
	require.NoError(t, err)
	blocks := regexp.MustCompile("(?s)\n```js\n(.*?)```\n").FindAllStringSubmatch(string(md), -1)
	require.Len(t, blocks, 1, "docs/api.md has one ```js block: the EventSource example")
	example := blocks[0][1]
	require.LessOrEqual(t, strings.Count(example, "\n"), 12, "the example stays short")

	script, err := filepath.Abs(filepath.Join(repoRoot, "scripts", "js.sh"))
	require.NoError(t, err)
	runJS(t, 5*time.Minute, nil, script) // npm ci when stale

	t.Run("a job to its end", func(t *testing.T) {
		t.Parallel()
		// The simulator answers after 300 ms, so the stream opens on a job still queued or running.
		b := setup(t, setupOpts{sim: llmsim.Config{Latency: 300 * time.Millisecond}})
		out := runJS(t, time.Minute, []string{"LLMQ_API=" + b.apiURL}, "node", "--input-type=module", "--eval", example)

		t.Logf("the example printed:\n%s", out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.GreaterOrEqual(t, len(lines), 2, "output:\n%s", out)
		require.Equal(t, "closed", lines[len(lines)-1], "the 204 after the end closes the EventSource; output:\n%s", out)
		var statuses []string
		for _, l := range lines[:len(lines)-1] {
			f := strings.Fields(l)
			require.Len(t, f, 3, "a line per event: id, status, attempts; got %q", l)
			statuses = append(statuses, f[1])
		}
		require.Equal(t, "succeeded", statuses[len(statuses)-1], "output:\n%s", out)
		require.Subset(t, []string{"queued", "running", "succeeded"}, statuses, "output:\n%s", out)
	})

	t.Run("a revoked tenant's page is told why", func(t *testing.T) {
		t.Parallel()
		// An idle stream checks its tenant again at a keep-alive once the tenants' cache TTL
		// passed: with both at 100 ms, the revocation is found within about 200 ms of it. The
		// simulator holds the call well past that, so the job is still running when it is; the
		// worker stopping at the test's end cuts the call rather than wait for it.
		b := setup(t, setupOpts{sim: llmsim.Config{Latency: 25 * time.Second}, keepAlive: 100 * time.Millisecond,
			tenantTTL: 100 * time.Millisecond, workerShutdown: 100 * time.Millisecond})
		token := strings.TrimPrefix(b.tenantHeader(t, "acme")["Authorization"], "Bearer ")
		revoked := make(chan error, 1)
		go func() { revoked <- revokeOnceStreamed(b, "acme", 20*time.Second) }()
		out := runJS(t, time.Minute, []string{"LLMQ_API=" + b.apiURL, "LLMQ_TOKEN=" + token},
			"node", "--input-type=module", "--eval", example)
		require.NoError(t, <-revoked)

		t.Logf("the example printed:\n%s", out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.GreaterOrEqual(t, len(lines), 3, "output:\n%s", out)
		require.Equal(t, []string{"refused token_revoked", "closed"}, lines[len(lines)-2:],
			"the refused event, then the 403 of the reconnect closes the EventSource; output:\n%s", out)
		for _, l := range lines[:len(lines)-2] {
			f := strings.Fields(l)
			require.Len(t, f, 3, "a line per event: id, status, attempts; got %q", l)
			require.Contains(t, []string{"queued", "running"}, f[1], "output:\n%s", out)
		}
	})
}

// revokeOnceStreamed waits until the job of tenant name is running and an event stream follows
// it (the job's watch, which a stream writes once its URL's tenant was checked: the replica's
// llmq_event_streams_open counts a stream before that check, and a revocation in between had
// the stream refused at its start, with no event), then revokes the tenant; it gives up after
// timeout.
func revokeOnceStreamed(b *testBundle, name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(b.ctx, timeout)
	defer cancel()
	pool, err := openPool(ctx, b.dbURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	for {
		var followed int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM jobs JOIN job_watches w ON w.job_id = jobs.id
WHERE tenant = $1 AND status = 'running'`, name).Scan(&followed)
		if err == nil && followed == 1 {
			_, err = tenant.NewStore(pool, nil).Revoke(ctx, name)
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no running job of %s followed by a stream within %s", name, timeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// runJS runs a program in test/js with env added to this process's environment and returns its
// standard output; it fails the test on a failure or after timeout (see runIn).
func runJS(t *testing.T, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	return runIn(t, filepath.Join(repoRoot, "test", "js"), timeout, env, name, args...)
}

// runIn runs a program in dir with env added to this process's environment and returns its
// standard output; it fails the test on a failure or after timeout, killing the program's whole
// process group.
func runIn(t *testing.T, dir string, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
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
