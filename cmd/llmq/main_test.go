package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/llmq/llmq/internal/process"
)

// TestRun_Commands: a missing or unknown command is an error naming the commands, with the
// usage printed; help prints the usage; a known command gets its flags.
func TestRun_Commands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args    []string
		wantErr string
	}{
		{nil, "no command given (want serve, api or worker)"},
		{[]string{"serv"}, `unknown command "serv" (want serve, api or worker)`},
		{[]string{"help"}, ""},
	} {
		var stderr bytes.Buffer
		err := run(ctx, tc.args, process.Options{Stderr: &stderr})
		if tc.wantErr == "" {
			require.NoError(t, err, tc.args)
		} else {
			require.EqualError(t, err, tc.wantErr, tc.args)
		}
		require.Contains(t, stderr.String(), "serve   the API and a worker in one process", tc.args)
	}
	// Each command parses its own flags: an unknown one is refused before anything opens.
	for _, cmd := range []string{"serve", "api", "worker"} {
		var stderr bytes.Buffer
		err := run(ctx, []string{cmd, "--no-such-flag"}, process.Options{Stderr: &stderr})
		require.ErrorContains(t, err, "flag provided but not defined: -no-such-flag", cmd)
	}
	// Asking a command for its flags (the usage says "llmq <command> -h") prints them and is no
	// error: the process exits 0, without an "llmq: flag: help requested" line.
	for _, cmd := range []string{"serve", "api", "worker"} {
		for _, h := range []string{"-h", "--help"} {
			var stderr bytes.Buffer
			err := run(ctx, []string{cmd, h}, process.Options{Stderr: &stderr})
			require.NoError(t, err, "%s %s", cmd, h)
			require.Contains(t, stderr.String(), "-config", "%s %s", cmd, h)
		}
	}
}

// TestRun_UsageErrorsExit2: a missing or unknown command and an unknown flag are usage errors
// (exit 2, said once), as ctl's are; they exited 1 like a failed run, the flag's error twice.
func TestRun_UsageErrorsExit2(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		args []string
		once string
	}{
		{nil, "llmq: no command given"},
		{[]string{"serv"}, `llmq: unknown command "serv"`},
		{[]string{"serve", "--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
	} {
		var stderr bytes.Buffer
		err := run(ctx, tc.args, process.Options{Stderr: &stderr})
		require.Equal(t, 2, process.ExitCode(&stderr, "llmq", err), tc.args)
		require.Equal(t, 1, strings.Count(stderr.String(), tc.once), "%v: %s", tc.args, stderr.String())
	}
}
