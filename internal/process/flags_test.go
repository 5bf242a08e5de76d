package process_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/httpserve"
	"github.com/llmq/llmq/internal/process"
)

// TestProcesses_RefusePositionalArguments: a word among the flags stops Go's flag parsing, so
// whatever follows it, flags included, would be ignored; every process refuses it before it
// reads its config or opens anything.
func TestProcesses_RefusePositionalArguments(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.yaml")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := process.Options{Stderr: io.Discard, Getenv: func(string) string { return "" }}
	for name, run := range map[string]func(context.Context, []string, process.Options) error{
		"api": process.API, "worker": process.Worker, "serve": process.Serve,
	} {
		err := run(ctx, []string{"--config", missing, "stray", "--listen", "127.0.0.1:1"}, o)
		require.ErrorContains(t, err, `unexpected argument "stray"`, name)
	}
}

// TestProcesses_RefuseAnUnreadableGOMAXPROCS: the runtime would take every core without a word.
// It reads a 32-bit number: a larger one is as unreadable to it as a word.
func TestProcesses_RefuseAnUnreadableGOMAXPROCS(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.yaml")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, v := range []string{"two", "0", "-1", "2147483648", "99999999999"} {
		o := process.Options{Stderr: io.Discard, Getenv: func(k string) string {
			if k == "GOMAXPROCS" {
				return v
			}
			return ""
		}}
		err := process.Serve(ctx, []string{"--config", missing}, o)
		require.ErrorContains(t, err, "GOMAXPROCS: must be", v)
	}
}

// TestProcesses_RefuseMaxConnectionsAboveTheFileLimit: past the open-file limit, the cap that
// answers 503 is never reached. Refused before the stores are opened (the database here has no
// server: without the check the process would wait for it until the context ends).
func TestProcesses_RefuseMaxConnectionsAboveTheFileLimit(t *testing.T) {
	if httpserve.OpenFileLimit() == 0 {
		t.Skip("no open-file limit known on this system")
	}
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(path, fmt.Appendf(nil, `database_url: postgres://postgres@127.0.0.1:1/none?sslmode=disable
api: { max_connections: %d }
credentials:
  - { name: a, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_env: K }
`, httpserve.OpenFileLimit()), 0o600))
	o := process.Options{Stderr: io.Discard, Getenv: func(k string) string {
		if k == "K" {
			return "sk-test"
		}
		return ""
	}}
	for name, run := range map[string]func(context.Context, []string, process.Options) error{"api": process.API, "serve": process.Serve} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := run(ctx, []string{"--config", path}, o)
		cancel()
		require.ErrorContains(t, err, "api.max_connections: ", name)
	}
}

// TestProcesses_RefuseAListenFlagWithoutPort: --listen and --metrics-listen override fields the
// config refuses when they are not host:port; the flags are refused as the fields are, before
// the stores are opened (the database here has no server: without the check the process would
// wait for it until the context ends, and name no flag).
func TestProcesses_RefuseAListenFlagWithoutPort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "llmq.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`database_url: postgres://postgres@127.0.0.1:1/none?sslmode=disable
credentials:
  - { name: a, provider: anthropic, base_url: "http://127.0.0.1:1", api_key_env: K }
`), 0o600))
	o := process.Options{Stderr: io.Discard, Getenv: func(k string) string {
		if k == "K" {
			return "sk-test"
		}
		return ""
	}}
	for _, tc := range []struct {
		name string
		run  func(context.Context, []string, process.Options) error
		flag string
	}{{"api", process.API, "listen"}, {"serve", process.Serve, "listen"}, {"worker", process.Worker, "metrics-listen"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := tc.run(ctx, []string{"--config", path, "--" + tc.flag, "8080"}, o)
		cancel()
		require.ErrorContains(t, err, "--"+tc.flag+": must be host:port", tc.name)
	}
}

// TestExitCode: a command line a process refuses (an unknown flag, a stray argument) exits 2, its
// error printed once; a failure of the run exits 1 after "name: error"; success 0, silently. An
// unknown flag exited 1 and was printed twice (by the flag package, then by main).
func TestExitCode(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.yaml")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for name, tc := range map[string]struct {
		args      []string
		code      int
		printedBy string // the line that says what is wrong, printed exactly once
	}{
		"UnknownFlag":     {[]string{"--bogus"}, 2, "flag provided but not defined: -bogus\n"},
		"StrayArgument":   {[]string{"--config", missing, "stray"}, 2, `api: api: unexpected argument "stray"`},
		"MissingConfig":   {[]string{"--config", missing}, 1, "api: config file"},
		"HelpIsNoFailure": {[]string{"-h"}, 0, "Usage of api:\n"},
	} {
		t.Run(name, func(t *testing.T) {
			var stderr strings.Builder
			err := process.API(ctx, tc.args, process.Options{Stderr: &stderr, Getenv: func(string) string { return "" }})
			code := process.ExitCode(&stderr, "api", err)
			require.Equal(t, tc.code, code, "stderr: %s", stderr.String())
			require.Equal(t, 1, strings.Count(stderr.String(), tc.printedBy), "stderr: %s", stderr.String())
		})
	}
	var stderr strings.Builder
	require.Zero(t, process.ExitCode(&stderr, "api", nil))
	require.Empty(t, stderr.String())
}
